// Instantiation: stock CUTLASS cooperative kernel, tile 256x128x64, cluster 2x1 (tile_probe.h).
#include "tile_probe_stock.cuh"

namespace tile_probe {
std::unique_ptr<StockGemm> MakeCooperative256x128Cluster2x1() {
  return std::make_unique<CutlassGemm<256, 128, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecializedCooperative>>("cutlass_coop_256x128_2x1");
}
}  // namespace tile_probe
