// Instantiation: stock CUTLASS cooperative kernel, tile 128x256x64, cluster 2x1, 3 mainloop
// stages (tile_probe.h).
#include "tile_probe_stock.cuh"

namespace tile_probe {
std::unique_ptr<StockGemm> MakeCooperative128x256Cluster2x1Stages3() {
  return std::make_unique<CutlassGemm<128, 256, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecializedCooperative, 3>>(
      "cutlass_coop_128x256_2x1_3_stages");
}
}  // namespace tile_probe
