// Instantiation: stock CUTLASS cooperative kernel, tile 128x256x64, cluster 2x1 (tile_probe.h).
#include "tile_probe_stock.cuh"

namespace tile_probe {
std::unique_ptr<StockGemm> MakeCooperative128x256Cluster2x1() {
  return std::make_unique<CutlassGemm<128, 256, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecializedCooperative>>("cutlass_coop_128x256_2x1");
}
}  // namespace tile_probe
