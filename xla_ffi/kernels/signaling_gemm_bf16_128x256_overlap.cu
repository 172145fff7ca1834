// Instantiation: bf16, tile 128x256, cluster 2x1, overlapped epilogue (the copy-out warps
// store and signal while the consumers run the next tile; see signaling_gemm_kernel.cuh).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmBf16Tile128x256Overlap, cutlass::bfloat16_t, 128, 256, 2, kCooperativeOverlap, kKN)
}  // namespace flashoverlap
