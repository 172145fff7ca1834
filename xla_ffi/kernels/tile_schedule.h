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
};

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

// rank_m: this CTA's rank along M inside its cluster (0 .. cluster_m-1).
FO_HOST_DEVICE TileWork DecodeUnit(const TileSchedule& s, int unit, int rank_m) {
  // Largest g with unit_start[g] <= unit (binary search: <= 7 steps for 64 groups).
  int lo = 0, hi = s.num_groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (s.unit_start[mid] <= unit) lo = mid; else hi = mid - 1;
  }
  const int g = lo;
  const int band0 = s.band_rows[g];
  const int h = s.band_rows[g + 1] - band0;
  const int crow_rows = s.block_m * s.cluster_m;
  const int ct = CeilDiv(h, crow_rows);           // cluster rows per rank block
  const int total_rows = s.num_blocks * ct;       // cluster rows in the group
  const int local = unit - s.unit_start[g];
  const int panel_units = s.panel * s.n_tiles;
  const int p = local / panel_units;
  const int within = local - p * panel_units;
  const int rows_in_panel = MinInt(s.panel, total_rows - p * s.panel);
  const int crow = p * s.panel + within % rows_in_panel;
  TileWork w;
  w.group = g;
  w.n_tile = within / rows_in_panel;
  if (s.serpentine && ((s.panel_start[g] + p) & 1)) w.n_tile = s.n_tiles - 1 - w.n_tile;
  const int j = crow / ct;                        // rank block
  const int o = (crow - j * ct) * crow_rows + rank_m * s.block_m;  // offset inside the band
  w.rows = MinInt(s.block_m, h - o);
  w.src_row = j * s.rows_per_block + band0 + o;
  // Group g occupies out rows [num_blocks*band0, num_blocks*band_rows[g+1]); block j's part
  // of it starts j*h rows in (signaling_gemm.h).
  w.dst_row = s.num_blocks * band0 + j * h + o;
  if (s.row_rotation != 0) {  // num_blocks == 1: src_row == dst_row before the rotation
    w.src_row += s.row_rotation;
    if (w.src_row >= s.m) w.src_row -= s.m;
    w.dst_row += s.row_rotation;
    if (w.dst_row >= s.m) w.dst_row -= s.m;
  }
  return w;
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
  return true;
}

}  // namespace flashoverlap
