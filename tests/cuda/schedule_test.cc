// Host-only check of the tile schedule (xla_ffi/kernels/tile_schedule.h), no GPU needed:
//   g++ -std=c++17 -O2 -I<cuda>/include -I. tests/cuda/schedule_test.cc -o schedule_test
// For random layouts (rank blocks, bands, tile shapes, panels) and row rotations (issue #9):
// every (row, column tile) of the output is covered by exactly one valid tile; tiles never
// straddle a band, a rank block, the rotation's wrap point or (with input flags) a flag
// block; destination rows follow signaling_gemm.h's group layout, rotated like the source
// rows; groups are handed out in order. Exit code 1 on any failure.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "xla_ffi/kernels/tile_schedule.h"

using namespace flashoverlap;

namespace {

int g_failures = 0;

#define EXPECT(cond, ...)                       \
  do {                                          \
    if (!(cond)) {                              \
      if (g_failures++ < 20) {                  \
        std::printf("FAIL %s: ", #cond);        \
        std::printf(__VA_ARGS__);               \
        std::printf("\n");                      \
      }                                         \
    }                                           \
  } while (0)

// Same construction as LaunchSignalingGemm (signaling_gemm.cu).
TileSchedule Build(int m, int n, int blocks, const std::vector<int>& bands, int bm, int bn,
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

// signaling_gemm.h's group layout, then the rotation.
int ExpectedDst(const TileSchedule& s, int sched_row) {
  const int j = sched_row / s.rows_per_block, o = sched_row % s.rows_per_block;
  int g = 0;
  while (s.band_rows[g + 1] <= o) ++g;
  const int h = s.band_rows[g + 1] - s.band_rows[g];
  int d = s.num_blocks * s.band_rows[g] + j * h + (o - s.band_rows[g]);
  if (s.row_rotation) d = (d + s.row_rotation) % s.m;
  return d;
}

void Check(const TileSchedule& s, int flag_rows, const char* what) {
  std::vector<int> cover(size_t(s.m) * s.n_tiles, 0);
  int last_group = 0;
  for (int u = 0; u < s.num_units; ++u) {
    for (int r = 0; r < s.cluster_m; ++r) {
      const TileWork w = DecodeUnit(s, u, r);
      EXPECT(w.group >= last_group, "%s: unit %d group %d after %d", what, u, w.group, last_group);
      last_group = w.group;
      if (w.rows <= 0) continue;
      EXPECT(w.src_row >= 0 && w.src_row + w.rows <= s.m, "%s: tile rows [%d, %d) outside M=%d",
             what, w.src_row, w.src_row + w.rows, s.m);
      if (!(w.src_row >= 0 && w.src_row + w.rows <= s.m)) continue;
      if (flag_rows > 0) {
        EXPECT(w.src_row / flag_rows == (w.src_row + w.rows - 1) / flag_rows,
               "%s: tile rows [%d, %d) span two flag blocks of %d", what, w.src_row,
               w.src_row + w.rows, flag_rows);
      }
      for (int i = 0; i < w.rows; ++i) {
        const int row = w.src_row + i;
        ++cover[size_t(row) * s.n_tiles + w.n_tile];
        // The schedule row of actual row `row`:
        const int sched_row = s.row_rotation ? (row - s.row_rotation + s.m) % s.m : row;
        EXPECT(w.dst_row + i == ExpectedDst(s, sched_row), "%s: row %d stored at %d, want %d",
               what, row, w.dst_row + i, ExpectedDst(s, sched_row));
      }
    }
  }
  for (size_t i = 0; i < cover.size(); ++i) {
    EXPECT(cover[i] == 1, "%s: row %zu tile %zu covered %d times", what, i / s.n_tiles,
           i % s.n_tiles, cover[i]);
  }
}

}  // namespace

int main() {
  std::mt19937 rng(12345);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int shapes[][3] = {{128, 128, 1}, {128, 256, 2}};
  int cases = 0;
  for (int it = 0; it < 3000; ++it) {
    const int* t = shapes[uni(0, 1)];
    const int bm = t[0], bn = t[1], cm = t[2];
    const int panel = uni(1, 9);
    const int n = 8 * uni(1, 80);
    const int mode = it % 3;  // 0: rank blocks (no rotation), 1: rotation, 2: rotation + flags
    if (mode == 0) {
      const int blocks = uni(1, 4);
      const int rows = uni(1, 700);
      std::vector<int> bands = {0};
      while (bands.back() < rows && int(bands.size()) <= kMaxGroups) {
        bands.push_back(std::min(rows, bands.back() + uni(1, 400)));
      }
      bands.back() = rows;
      Check(Build(blocks * rows, n, blocks, bands, bm, bn, cm, panel, 0, it & 1), 0, "blocks");
    } else {
      // n_flag flag blocks of f rows (mode 2) or free bands with one wrap boundary (mode 1).
      const int nb = uni(1, 8), f = uni(1, 500), m = nb * f;
      std::vector<int> bands = {0};
      for (int b = 0; b < nb; ++b) {  // every block boundary, plus random cuts inside
        const int base = b * f;
        int cut = base;
        while (int(bands.size()) < kMaxGroups - nb && uni(0, 2) == 0) {
          cut += uni(1, f);
          if (cut >= base + f) break;
          bands.push_back(cut);
        }
        bands.push_back(base + f);
      }
      const int rot = f * uni(0, nb - 1);
      Check(Build(m, n, 1, bands, bm, bn, cm, panel, rot, (it >> 1) & 1), mode == 2 ? f : 0,
            mode == 1 ? "rotation" : "rotation+flags");
    }
    ++cases;
  }
  // Serpentine: one-cluster-row bands (one panel each) alternate their column direction, so
  // the last unit of band g and the first of band g+1 share a column tile.
  {
    std::vector<int> bands;
    for (int b = 0; b <= 8; ++b) bands.push_back(256 * b);
    const TileSchedule s = Build(2048, 4096, 1, bands, 128, 256, 2, 8, 0, 1);
    for (int g = 0; g + 1 < 8; ++g) {
      const TileWork last = DecodeUnit(s, s.unit_start[g + 1] - 1, 0);
      const TileWork first = DecodeUnit(s, s.unit_start[g + 1], 0);
      EXPECT(last.n_tile == first.n_tile, "serpentine: band %d ends at column %d, band %d starts "
             "at %d", g, last.n_tile, g + 1, first.n_tile);
      EXPECT(DecodeUnit(s, s.unit_start[g], 0).n_tile == ((g & 1) ? s.n_tiles - 1 : 0),
             "serpentine: band %d starts at column %d", g, DecodeUnit(s, s.unit_start[g], 0).n_tile);
    }
    const TileSchedule off = Build(2048, 4096, 1, bands, 128, 256, 2, 8, 0, 0);
    EXPECT(DecodeUnit(off, off.unit_start[1], 0).n_tile == 0, "serpentine off: reversed");
    ++cases;
  }
  std::printf("schedule: %d layouts, %d failure(s)\n", cases, g_failures);
  return g_failures ? 1 : 0;
}
