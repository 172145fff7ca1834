// What the host-only checks of the kernels' host code share (schedule_test.cc,
// peer_reduce_layout_test.cc): a failure counter with an EXPECT that prints the first 20,
// and the tile schedule built the way the launcher builds it (signaling_gemm.cu, PlanLaunch).
#pragma once

#include <cstdio>
#include <vector>

#include "xla_ffi/kernels/tile_schedule.h"

namespace flashoverlap {
namespace host_check {

inline int g_failures = 0;

#define EXPECT(cond, ...)                                 \
  do {                                                    \
    if (!(cond)) {                                        \
      if (::flashoverlap::host_check::g_failures++ < 20) { \
        std::printf("FAIL %s: ", #cond);                  \
        std::printf(__VA_ARGS__);                         \
        std::printf("\n");                                \
      }                                                   \
    }                                                     \
  } while (0)

// Same construction as LaunchSignalingGemm (signaling_gemm.cu).
inline TileSchedule Build(int m, int n, int blocks, const std::vector<int>& bands, int bm, int bn,
                          int cm, int panel, int rotation, int serpentine = 1) {
  TileSchedule s;
  s.m = m;
  s.n = n;
  s.num_blocks = blocks;
  s.num_groups = int(bands.size()) - 1;
  s.rows_per_block = m / blocks;
  s.block_m = bm;
  s.block_n = bn;
  s.cluster_m = cm;
  s.n_tiles = CeilDiv(n, bn);
  s.panel = panel;
  s.row_rotation = rotation;
  s.serpentine = serpentine;
  for (size_t g = 0; g < bands.size(); ++g) s.band_rows[g] = bands[g];
  CountUnits(s);
  return s;
}

}  // namespace host_check
}  // namespace flashoverlap
