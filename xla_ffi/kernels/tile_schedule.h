// Tile order of the signaling GEMM: maps a work-unit index to the output tile one CTA
// computes. Shared by the host launcher (which fills TileSchedule) and the device kernel
// (which decodes units); no CUTLASS, XLA or Python headers.
//
// A work unit is one cluster's job: cluster_m vertically adjacent tiles of block_m rows
// that share one block_n column range (the cluster multicasts the w tile to all of them).
// Units are numbered group by group (all of group g before any of g+1), so a persistent
// grid that hands unit u to cluster u % grid finishes groups roughly in order and the
// first groups' communication can start early.
//
// Inside a group, the "cluster rows" are the cluster_m*block_m-row slices of band g of
// every rank block (block-major). They are walked in panels of `panel` cluster rows;
// inside a panel the unit index runs down the rows first, then across the column tiles.
// A wave of G consecutive units therefore covers ~panel rows x G/panel columns, which
// keeps both the x rows and the w columns it touches small enough to stay in L2
// (row-major order would stream all of w through L2 once per wave).
//
// Serpentine (default): every other panel, counted across groups, walks the column tiles
// right to left, so a wave that spans a panel boundary touches the same w columns on both
// sides. Narrow bands (one panel each, shorter than `panel` rows) are where it matters: there
// a wave covers whole bands, and in one direction it reads all of w (measured: 16-32 groups
// of 256-512 rows cost the GEMM 4.5-5.5% against 3 groups).
#pragma once

#include "signaling_gemm.h"

#if defined(__CUDACC__)
#define FO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FO_HOST_DEVICE inline
#endif

namespace flashoverlap {

struct TileSchedule {
  int m = 0, n = 0;
  int num_blocks = 1, num_groups = 1, rows_per_block = 0;
  int block_m = 128, block_n = 256, cluster_m = 1;
  int n_tiles = 0;
  int panel = 8;       // cluster rows per L2 panel, >= 1
  int num_units = 0;   // total work units
  int row_rotation = 0;  // signaling_gemm.h: schedule row o -> row (o + row_rotation) % m
  int serpentine = 1;  // reverse the column order of every other panel (above)
  int band_rows[kMaxGroups + 1] = {0};
  int unit_start[kMaxGroups + 1] = {0};  // units before group g; unit_start[num_groups] == num_units
  int panel_start[kMaxGroups + 1] = {0};  // panels before group g (the serpentine's parity)
  // Split tail (signaling_gemm.h; PlanSplitTail): the queue hands out the whole units
  // [0, num_units - split_units), then split_chunks chunks of split_len k tiles each that
  // cut the K loops of the last split_units units. split_units == 0: no split tail.
  int k_tiles = 0;
  int split_units = 0, split_chunks = 0, split_len = 0;
  int num_items = 0;  // what the queue (or the round robin) hands out
};

constexpr int kGemmBlockK = 64;        // every instance's K tile
constexpr int kSplitMinKTiles = 16;    // shorter K loops: a partial tile costs more than it saves

// One piece of a queue item: k tiles [k_begin, k_begin + k_count) of one unit.
enum PieceKind : int {
  kPieceWhole = 0,         // the whole K loop: store the tile and signal
  kPieceStorePartial = 1,  // the first part: leave the fp32 sum in partial slot `slot`
  kPieceAddPartial = 2,    // the rest: add slot `slot` (the previous chunk's), store, signal
};
struct Piece {
  int unit, k_begin, k_count, kind, slot;
};
constexpr int kMaxPiecesPerItem = 3;

struct TileWork {
  int group;
  int n_tile;
  int src_row;  // first row of x (and of the logical output) this CTA's tile covers
  int dst_row;  // first row of `out` where that tile is stored (group layout)
  int rows;     // valid rows, <= block_m; <= 0 means an idle cluster partner (no store, no signal)
};

FO_HOST_DEVICE int CeilDiv(int a, int b) { return (a + b - 1) / b; }
FO_HOST_DEVICE int MinInt(int a, int b) { return a < b ? a : b; }

// Cluster rows of group g: band g of every rank block, each cut into cluster_m*block_m rows.
FO_HOST_DEVICE int ClusterRowsInGroup(const TileSchedule& s, int g) {
  const int h = s.band_rows[g + 1] - s.band_rows[g];
  return s.num_blocks * CeilDiv(h, s.block_m * s.cluster_m);
}

// What DecodeUnit needs of one group, read from the schedule once per group (a persistent
// CTA decodes its units in nearly increasing order: UnitDecoder keeps the current group's).
struct GroupView {
  int g = -1;
  int first = 0, end = 0;  // the group's units: [first, end)
  int band0 = 0, h = 0, ct = 0, total_rows = 0, panel_units = 0, panel_start = 0;
};

FO_HOST_DEVICE int GroupOfUnit(const TileSchedule& s, int unit) {
  // Largest g with unit_start[g] <= unit (binary search: <= 7 steps for 64 groups).
  int lo = 0, hi = s.num_groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (s.unit_start[mid] <= unit) lo = mid; else hi = mid - 1;
  }
  return lo;
}

FO_HOST_DEVICE GroupView ViewGroup(const TileSchedule& s, int g) {
  GroupView v;
  v.g = g;
  v.first = s.unit_start[g];
  v.end = s.unit_start[g + 1];
  v.band0 = s.band_rows[g];
  v.h = s.band_rows[g + 1] - v.band0;
  v.ct = CeilDiv(v.h, s.block_m * s.cluster_m);  // cluster rows per rank block
  v.total_rows = s.num_blocks * v.ct;            // cluster rows in the group
  v.panel_units = s.panel * s.n_tiles;
  v.panel_start = s.panel_start[g];
  return v;
}

// Unit `unit` of group v.g; rank_m: this CTA's rank along M inside its cluster.
FO_HOST_DEVICE TileWork DecodeInGroup(const TileSchedule& s, const GroupView& v, int unit, int rank_m) {
  const int crow_rows = s.block_m * s.cluster_m;
  const int local = unit - v.first;
  const int p = local / v.panel_units;
  const int within = local - p * v.panel_units;
  const int rows_in_panel = MinInt(s.panel, v.total_rows - p * s.panel);
  const int crow = p * s.panel + within % rows_in_panel;
  TileWork w;
  w.group = v.g;
  w.n_tile = within / rows_in_panel;
  if (s.serpentine && ((v.panel_start + p) & 1)) w.n_tile = s.n_tiles - 1 - w.n_tile;
  const int j = crow / v.ct;                      // rank block
  const int o = (crow - j * v.ct) * crow_rows + rank_m * s.block_m;  // offset inside the band
  w.rows = MinInt(s.block_m, v.h - o);
  w.src_row = j * s.rows_per_block + v.band0 + o;
  // Group g occupies out rows [num_blocks*band0, num_blocks*band_rows[g+1]); block j's part
  // of it starts j*h rows in (signaling_gemm.h).
  w.dst_row = s.num_blocks * v.band0 + j * v.h + o;
  if (s.row_rotation != 0) {  // num_blocks == 1: src_row == dst_row before the rotation
    w.src_row += s.row_rotation;
    if (w.src_row >= s.m) w.src_row -= s.m;
    w.dst_row += s.row_rotation;
    if (w.dst_row >= s.m) w.dst_row -= s.m;
  }
  return w;
}

// rank_m: this CTA's rank along M inside its cluster (0 .. cluster_m-1).
FO_HOST_DEVICE TileWork DecodeUnit(const TileSchedule& s, int unit, int rank_m) {
  return DecodeInGroup(s, ViewGroup(s, GroupOfUnit(s, unit)), unit, rank_m);
}

// DecodeUnit with the current group's values kept between calls: the schedule lives in
// kernel parameters, whose dynamically indexed reads (the group search, the group's bands)
// took most of the ~2,000 cycles a decode cost the producer between two units' loads.
struct UnitDecoder {
  GroupView v;
  FO_HOST_DEVICE TileWork Decode(const TileSchedule& s, int unit, int rank_m) {
    if (unit < v.first || unit >= v.end) v = ViewGroup(s, GroupOfUnit(s, unit));
    return DecodeInGroup(s, v, unit, rank_m);
  }
};

// Pieces of queue item `item` in the order a cluster processes them (1 to 3). A chunk that
// ends inside a unit stores that unit's first part as a partial *first*, and finishes the
// unit it starts inside (adding the previous chunk's partial) *last*: a chunk's wait is
// then only for a piece that an earlier-claimed chunk does before anything else, so every
// wait ends (claims are handed out in order and every claimed chunk is being run).
FO_HOST_DEVICE int ItemPieces(const TileSchedule& s, int item, Piece* out) {
  const int first_split = s.num_units - s.split_units;
  if (item < first_split) {
    out[0] = Piece{item, 0, s.k_tiles, kPieceWhole, 0};
    return 1;
  }
  const int c = item - first_split;
  const long long k = s.k_tiles;
  const long long total = static_cast<long long>(s.split_units) * k;
  const long long begin = static_cast<long long>(c) * s.split_len;
  const long long end = begin + s.split_len < total ? begin + s.split_len : total;
  int n = 0;
  if (end % k != 0) {  // split_len >= k_tiles: the unit started in this chunk
    const long long b = end / k;
    out[n++] = Piece{first_split + int(b), 0, int(end - b * k), kPieceStorePartial, c};
  }
  for (long long u = (begin + k - 1) / k; (u + 1) * k <= end; ++u)
    out[n++] = Piece{first_split + int(u), 0, int(k), kPieceWhole, 0};
  if (begin % k != 0) {  // ... and ends in this one (split_len >= k_tiles)
    const long long a = begin / k;
    out[n++] = Piece{first_split + int(a), int(begin - a * k), int((a + 1) * k - begin),
                     kPieceAddPartial, c - 1};
  }
  return n;
}

// Host: the split tail for a grid of `clusters` clusters, when it pays. The last wave holds
// R = num_units % clusters units; the last two waves (clusters + R units) become one chunk
// per cluster of (clusters + R) / clusters units' worth of K tiles, which ends about
// 1 - R / clusters unit times sooner than two waves of whole units; each chunk pays at most
// one partial tile's store and one's load (measured through JAX, 1 x H200: ~0.2 unit times
// at most; R / clusters = 0.76 gained 0.7%, 0.79 nothing). Off when R == 0, when
// R > 0.7 * clusters, for fewer than kSplitMinKTiles K tiles, or when the partials would need
// more than max_slots.
inline void PlanSplitTail(TileSchedule& s, int clusters, int max_slots) {
  s.split_units = s.split_chunks = s.split_len = 0;
  s.num_items = s.num_units;
  const int C = clusters, U = s.num_units;
  if (C < 2 || U <= C || s.k_tiles < kSplitMinKTiles) return;
  const int R = U % C;
  if (R == 0 || 10 * R > 7 * C) return;
  const long long total = static_cast<long long>(C + R) * s.k_tiles;
  const int len = static_cast<int>((total + C - 1) / C);
  const int chunks = static_cast<int>((total + len - 1) / len);
  if (chunks - 1 > max_slots) return;  // chunk c < chunks - 1 leaves partial slot c
  s.split_units = C + R;
  s.split_chunks = chunks;
  s.split_len = len;
  s.num_items = U - (C + R) + chunks;
}

// Host: unit_start, panel_start and num_units from the layout fields. False when the
// schedule would have more than 2^30 units.
inline bool CountUnits(TileSchedule& s) {
  long long units = 0, panels = 0;
  for (int g = 0; g <= s.num_groups; ++g) {
    s.unit_start[g] = static_cast<int>(units);
    s.panel_start[g] = static_cast<int>(panels);
    if (g == s.num_groups) break;
    const int rows = ClusterRowsInGroup(s, g);
    units += static_cast<long long>(rows) * s.n_tiles;
    panels += CeilDiv(rows, s.panel);
    if (units > (1LL << 30)) return false;
  }
  s.num_units = static_cast<int>(units);
  s.num_items = s.num_units;  // no split tail until PlanSplitTail
  return true;
}

}  // namespace flashoverlap
