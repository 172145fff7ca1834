// Instantiation: f16, tile 128x256, cluster 2x1, w given as [N, K], overlapped epilogue
// staged in halves (FLASHOVERLAP_GEMM_EPILOGUE=halves).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmF16Tile128x256HalvesNK, cutlass::half_t, 128, 256, 2, kCooperativeOverlapHalves, kNK)
}  // namespace flashoverlap
