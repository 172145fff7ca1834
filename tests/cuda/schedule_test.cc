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
#include <string>
#include <vector>

#include "tests/cuda/host_check.h"
#include "xla_ffi/kernels/tile_schedule.h"

using namespace flashoverlap;
using host_check::Build;
using host_check::g_failures;

namespace {

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

void CheckDecoder(const TileSchedule& s, const char* what, uint64_t seed);

void Check(const TileSchedule& s, int flag_rows, const char* what) {
  CheckDecoder(s, what, uint64_t(s.m) * 131 + s.n + s.num_units);
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

bool SameWork(const TileWork& a, const TileWork& b) {
  return a.group == b.group && a.n_tile == b.n_tile && a.src_row == b.src_row &&
         a.dst_row == b.dst_row && a.rows == b.rows;
}

// The producer's cached decoder (UnitDecoder) against DecodeUnit, in the orders units reach
// a producer: one cluster's round-robin share (increasing, across groups), and a shuffled
// walk with steps back (the split tail's pieces go back to an earlier unit).
void CheckDecoder(const TileSchedule& s, const char* what, uint64_t seed) {
  for (int r = 0; r < s.cluster_m; ++r) {
    UnitDecoder inc, walk;
    for (int u = int(seed % 7); u < s.num_units; u += 1 + int(seed % 5)) {
      EXPECT(SameWork(inc.Decode(s, u, r), DecodeUnit(s, u, r)), "%s: decoder differs at unit %d", what, u);
    }
    uint64_t x = seed | 1;
    for (int i = 0; i < 200 && s.num_units > 0; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const int u = int(x % uint64_t(s.num_units));
      EXPECT(SameWork(walk.Decode(s, u, r), DecodeUnit(s, u, r)), "%s: decoder differs at unit %d (walk)", what, u);
    }
  }
}

// Split tail (PlanSplitTail / ItemPieces): every unit's K loop is covered exactly once; a
// split unit is one partial store and one partial add on the same slot, the add in a later
// chunk; a chunk stores its partial first and adds last (so a wait is only ever for the
// first piece of an earlier-claimed chunk); chunks are at most split_len k tiles and at
// least k_tiles; slots stay below max_slots. Returns false when no split was planned.
bool CheckSplit(int units, int clusters, int k_tiles, int max_slots) {
  TileSchedule s;
  s.num_units = units;
  s.k_tiles = k_tiles;
  PlanSplitTail(s, clusters, max_slots);
  if (s.split_units == 0) {
    EXPECT(s.num_items == units, "no split: %d items for %d units", s.num_items, units);
    return false;
  }
  const int R = units % clusters;
  EXPECT(s.split_units == clusters + R && s.split_chunks <= clusters,
         "U=%d C=%d: %d split units in %d chunks", units, clusters, s.split_units, s.split_chunks);
  EXPECT(s.num_items == units - s.split_units + s.split_chunks, "items %d", s.num_items);
  std::vector<int> covered(size_t(units) * k_tiles, 0);
  std::vector<int> store_chunk(max_slots + 1, -1), add_chunk(max_slots + 1, -1);
  std::vector<int> store_unit(max_slots + 1, -1), add_unit(max_slots + 1, -1);
  for (int item = 0; item < s.num_items; ++item) {
    Piece p[kMaxPiecesPerItem + 1];
    const int n = ItemPieces(s, item, p);
    EXPECT(n >= 1 && n <= kMaxPiecesPerItem, "item %d has %d pieces", item, n);
    int k_sum = 0;
    for (int i = 0; i < n; ++i) {
      EXPECT(p[i].k_count >= 1 && p[i].k_begin >= 0 && p[i].k_begin + p[i].k_count <= k_tiles,
             "item %d piece %d: k [%d, +%d)", item, i, p[i].k_begin, p[i].k_count);
      for (int k = p[i].k_begin; k < p[i].k_begin + p[i].k_count; ++k)
        ++covered[size_t(p[i].unit) * k_tiles + k];
      k_sum += p[i].k_count;
      if (p[i].kind == kPieceWhole) {
        EXPECT(p[i].k_begin == 0 && p[i].k_count == k_tiles, "whole piece not whole");
        continue;
      }
      const int slot = p[i].slot;
      EXPECT(slot >= 0 && slot < max_slots, "slot %d of %d", slot, max_slots);
      if (slot < 0 || slot >= max_slots) continue;
      const int chunk = item - (units - s.split_units);
      if (p[i].kind == kPieceStorePartial) {
        EXPECT(i == 0 && p[i].k_begin == 0, "chunk %d: partial store is piece %d", chunk, i);
        EXPECT(store_chunk[slot] < 0, "slot %d stored twice", slot);
        store_chunk[slot] = chunk, store_unit[slot] = p[i].unit;
      } else {
        EXPECT(i == n - 1 && p[i].k_begin + p[i].k_count == k_tiles,
               "chunk %d: partial add is piece %d of %d", chunk, i, n);
        EXPECT(add_chunk[slot] < 0, "slot %d added twice", slot);
        add_chunk[slot] = chunk, add_unit[slot] = p[i].unit;
      }
    }
    if (item >= units - s.split_units) EXPECT(k_sum <= s.split_len, "chunk of %d > %d", k_sum, s.split_len);
  }
  for (size_t i = 0; i < covered.size(); ++i)
    EXPECT(covered[i] == 1, "U=%d C=%d k=%d: unit %zu k tile %zu covered %d times", units,
           clusters, k_tiles, i / k_tiles, i % k_tiles, covered[i]);
  for (int slot = 0; slot <= max_slots; ++slot) {
    EXPECT((store_chunk[slot] < 0) == (add_chunk[slot] < 0), "slot %d: store %d add %d", slot,
           store_chunk[slot], add_chunk[slot]);
    if (store_chunk[slot] >= 0)
      EXPECT(add_chunk[slot] == store_chunk[slot] + 1 && add_unit[slot] == store_unit[slot],
             "slot %d: stored by chunk %d (unit %d), added by chunk %d (unit %d)", slot,
             store_chunk[slot], store_unit[slot], add_chunk[slot], add_unit[slot]);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // `schedule_test split`: for each "units clusters k_tiles max_slots" line on stdin, print
  // PlanSplitTail's "split_units split_chunks split_len" (the Python cost model's mirror,
  // tile_schedule.split_tail, is compared against it by tests/test_tile_schedule.py).
  if (argc > 1 && std::string(argv[1]) == "split") {
    int units, clusters, k_tiles, max_slots;
    while (std::scanf("%d %d %d %d", &units, &clusters, &k_tiles, &max_slots) == 4) {
      TileSchedule s;
      s.num_units = units;
      s.k_tiles = k_tiles;
      PlanSplitTail(s, clusters, max_slots);
      std::printf("%d %d %d\n", s.split_units, s.split_chunks, s.split_len);
    }
    return 0;
  }
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
  // Split tail: random grids; and the cases it must (not) take.
  int splits = 0;
  for (int it = 0; it < 3000; ++it) {
    const int clusters = uni(1, 140), units = uni(1, 3000), k_tiles = uni(1, 300);
    splits += CheckSplit(units, clusters, k_tiles, uni(1, 300));
  }
  EXPECT(CheckSplit(1024, 66, 64, 66), "8192 x 8192 x 4096 on 66 clusters: no split");
  EXPECT(CheckSplit(512, 62, 64, 66), "4096 x 8192 x 4096 on 62 clusters: no split");
  EXPECT(!CheckSplit(1056, 66, 64, 66), "a full last wave was split");
  EXPECT(!CheckSplit(1050, 66, 64, 66), "a 60/66 last wave was split");
  EXPECT(!CheckSplit(512, 66, 64, 66), "a 50/66 last wave was split");
  EXPECT(CheckSplit(2048, 58, 64, 66), "16384 x 8192 on 58 clusters (R 18): no split");
  EXPECT(!CheckSplit(1024, 66, 8, 66), "8 K tiles were split");
  EXPECT(!CheckSplit(60, 66, 64, 66), "less than one wave was split");
  std::printf("split tail: %d random grids split\n", splits);
  std::printf("schedule: %d layouts, %d failure(s)\n", cases, g_failures);
  return g_failures ? 1 : 0;
}
