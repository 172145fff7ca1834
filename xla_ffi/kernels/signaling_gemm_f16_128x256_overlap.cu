// Instantiation: f16, tile 128x256, cluster 2x1, overlapped epilogue (the copy-out warps
// store and signal while the consumers run the next tile; see signaling_gemm_kernel.cuh).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmF16Tile128x256Overlap, cutlass::half_t, 128, 256, 2, kCooperativeOverlap, kKN)
}  // namespace flashoverlap
