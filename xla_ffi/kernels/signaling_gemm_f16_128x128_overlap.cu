// Instantiation: f16, tile 128x128, cluster 1x1, overlapped epilogue (the copy-out warps
// store and signal while the consumers run the next tile; see signaling_gemm_kernel.cuh).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmF16Tile128x128Overlap, cutlass::half_t, 128, 128, 1, kCooperativeOverlap, kKN)
}  // namespace flashoverlap
