// Instantiation: f16, tile 128x256, cluster 2x1, overlapped epilogue, w given as [N, K]
// (K-major: out = x @ w^T with w read in place; signaling_gemm.h, transpose_w).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmF16Tile128x256OverlapNK, cutlass::half_t, 128, 256, 2, kCooperativeOverlap, kNK)
}  // namespace flashoverlap
