// Instantiation: bf16, tile 128x256, cluster 2x1, w given as [N, K], overlapped epilogue
// staged in halves (FLASHOVERLAP_GEMM_EPILOGUE=halves).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmBf16Tile128x256HalvesNK, cutlass::bfloat16_t, 128, 256, 2, kCooperativeOverlapHalves, kNK)
}  // namespace flashoverlap
