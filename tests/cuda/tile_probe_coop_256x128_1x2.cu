// Instantiation: stock CUTLASS cooperative kernel, tile 256x128x64, cluster 1x2 (tile_probe.h).
#include "tile_probe_stock.cuh"

namespace tile_probe {
std::unique_ptr<StockGemm> MakeCooperative256x128Cluster1x2() {
  return std::make_unique<CutlassGemm<256, 128, 1, 2, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecializedCooperative>>("cutlass_coop_256x128_1x2");
}
}  // namespace tile_probe
