// Instantiation: bf16, tile 128x256, cluster 2x1, overlapped epilogue staged in halves (one
// consumer warpgroup's rows at a time: 4 mainloop stages; FLASHOVERLAP_GEMM_EPILOGUE=halves).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE(SignalingGemmBf16Tile128x256Halves, cutlass::bfloat16_t, 128, 256, 2, kCooperativeOverlapHalves, kKN)
}  // namespace flashoverlap
