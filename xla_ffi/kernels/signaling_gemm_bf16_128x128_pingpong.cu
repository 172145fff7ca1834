// Instantiation: bf16, tile 128x128 per consumer warpgroup, cluster 2x1, ping-pong consumers
// (each warpgroup computes, stores and signals its own tiles in turn; see
// signaling_gemm_consumers.cuh).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmBf16Tile128x128PingPong, cutlass::bfloat16_t, 128, 128, 2, kPingPong, kKN)
}  // namespace flashoverlap
