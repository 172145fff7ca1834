// Instantiation: f16 inputs/output, tile 128x128, cluster 1x1 (see signaling_gemm_kernel.cuh).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmF16Tile128x128, cutlass::half_t, 128, 128, 1, kCooperative, kKN)
}  // namespace flashoverlap
