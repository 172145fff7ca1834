// Instantiation: f16, tile 128x256, cluster 2x1, overlapped epilogue, w given as [N, K], for peer-store
// launches with several mirrors (Config's kPeerStores_: the mirrors by bulk copies).
#include "signaling_gemm_kernel.cuh"

namespace flashoverlap {
FO_DEFINE_SIGNALING_GEMM_INSTANCE_FOR(SignalingGemmF16Tile128x256OverlapNKPeer, cutlass::half_t, 128, 256, 2, kCooperativeOverlap, kNK, true)
}  // namespace flashoverlap
