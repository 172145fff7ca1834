// Instantiation: f16 inputs/output, tile 128x256, cluster 2x1 (see signaling_gemm_kernel.cuh).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmF16Tile128x256, cutlass::half_t, 128, 256, 2, kCooperative, kKN)
}  // namespace flashoverlap
