// Host-only check of the peer-reduce launch (xla_ffi/comm/peer_reduce_args.h) against the
// tile schedule the kernel walks (xla_ffi/kernels/tile_schedule.h), no GPU needed:
//   g++ -std=c++17 -O2 -I<cuda>/include -I. tests/cuda/peer_reduce_layout_test.cc -o t && ./t
// For random shapes, band layouts, both tile shapes, both ranks and both ops: every tile of
// the peer's block is a head group stored at its row of the peer's recv and counted in the
// peer's counter of its band; every tile of ours is stored at its row of our result, adds the
// partial at the same row of our recv, waits for our counter of its band (which the peer's
// head group of that band fills with exactly as many tiles), and, for an all-reduce, is
// mirrored at its row of the peer's result. Addresses are plain numbers here (never
// dereferenced). Exit code 1 on any failure.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "tests/cuda/host_check.h"
#include "xla_ffi/comm/peer_reduce_args.h"
#include "xla_ffi/kernels/tile_schedule.h"

using namespace flashoverlap;
using host_check::g_failures;

namespace {

uintptr_t At(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The launcher's schedule for these args, for a tile shape.
TileSchedule Schedule(const SignalingGemmArgs& a, int bm, int bn, int cm) {
  const std::vector<int> bands(a.layout.band_rows, a.layout.band_rows + a.layout.num_groups + 1);
  return host_check::Build(int(a.m), int(a.n), a.layout.num_blocks, bands, bm, bn, cm, 8, a.row_rotation);
}

int TilesOf(const TileSchedule& s, int g) {
  return s.num_blocks * CeilDiv(s.band_rows[g + 1] - s.band_rows[g], s.block_m) * s.n_tiles;
}

struct Rank {
  uintptr_t recv, signals, result;
};

void CheckCase(int rows, int n, const std::vector<int>& bands, int bm, int bn, int cm, PeerReduceKind kind) {
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int64_t m = 2 * int64_t(rows);
  const size_t row_bytes = size_t(n) * 2;
  // Far-apart fake addresses, 256-byte aligned.
  const Rank ranks[2] = {{0x100000000000ull, 0x110000000000ull, 0x120000000000ull},
                         {0x200000000000ull, 0x210000000000ull, 0x220000000000ull}};
  SignalingGemmArgs gemm;
  gemm.m = m;
  gemm.n = n;
  gemm.k = 64;
  gemm.layout.num_groups = int(bands.size()) - 1;
  for (size_t g = 0; g < bands.size(); ++g) gemm.layout.band_rows[g] = bands[g];
  const int G = gemm.layout.num_groups;
  TileSchedule sched[2];
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    PeerReduceBuffers b;
    b.rank = r;
    b.recv = reinterpret_cast<const void*>(ranks[r].recv);
    b.signals = reinterpret_cast<int32_t*>(ranks[r].signals);
    b.peer_recv = reinterpret_cast<void*>(ranks[peer].recv);
    b.peer_signals = reinterpret_cast<int32_t*>(ranks[peer].signals);
    const SignalingGemmArgs a = PeerReduceLaunchArgs(b, kind, gemm, reinterpret_cast<void*>(ranks[r].result), 9);
    const char* what = ar ? "AR" : "RS";
    EXPECT(a.layout.num_groups == 2 * G && a.head_groups == G, "%s: groups %d, head %d", what, a.layout.num_groups,
           a.head_groups);
    EXPECT(a.layout.band_rows[2 * G] == m, "%s: bands end at %d, M = %lld", what, a.layout.band_rows[2 * G], (long long)m);
    for (int g = 0; g < 2 * G; ++g) EXPECT(a.layout.band_rows[g] < a.layout.band_rows[g + 1], "%s: band %d empty", what, g);
    if (a.row_rotation != 0) {
      bool boundary = false;
      for (int g = 0; g <= 2 * G; ++g) boundary |= a.layout.band_rows[g] == m - a.row_rotation;
      EXPECT(boundary, "%s: M - rotation %lld not a band boundary", what, (long long)(m - a.row_rotation));
    }
    EXPECT(At(a.head_counters) == ranks[peer].signals + 4 * kPeerArrived, "%s rank %d: head counters", what, r);
    EXPECT(At(a.add_counters) == ranks[r].signals + 4 * kPeerArrived, "%s rank %d: add counters", what, r);
    EXPECT(At(a.peer_failed) == ranks[r].signals + 4 * kPeerFailed, "%s rank %d: failed word", what, r);
    EXPECT(a.counters == nullptr && !a.signal_system, "%s rank %d: own tiles signal nothing", what, r);
    if (ar) {
      EXPECT(At(a.mirror_slot) == ranks[r].signals + 4 * kPeerMailbox && a.mirror_call == 9 && At(a.mirror_slot) % 8 == 0,
             "%s rank %d: mailbox", what, r);
    } else {
      EXPECT(a.mirror_slot == nullptr, "%s rank %d: no mirror stores", what, r);
    }
    const TileSchedule& s = sched[r] = Schedule(a, bm, bn, cm);
    for (int u = 0; u < s.num_units; ++u) {
      for (int rm = 0; rm < s.cluster_m; ++rm) {
        const TileWork w = DecodeUnit(s, u, rm);
        if (w.rows <= 0) continue;
        const bool head = w.group < a.head_groups;
        for (int i = 0; i < w.rows; i += (w.rows > 1 ? w.rows - 1 : 1)) {  // first and last row
          const int64_t x_row = w.src_row + i, dst = w.dst_row + i;
          const int64_t block = x_row / rows, row_in_block = x_row % rows;
          EXPECT(head == (block == peer), "%s rank %d: x row %lld (block %lld) in group %d, head %d", what, r,
                 (long long)x_row, (long long)block, w.group, int(head));
          const int band = head ? w.group : w.group - G;
          EXPECT(band >= 0 && band < G && bands[band] <= row_in_block && row_in_block < bands[band + 1],
                 "%s rank %d: row %lld of its block not in band %d", what, r, (long long)row_in_block, band);
          if (head) {
            EXPECT(At(a.head_out) + dst * row_bytes == ranks[peer].recv + row_in_block * row_bytes,
                   "%s rank %d: head row %lld stored off its place in the peer's recv", what, r, (long long)x_row);
            continue;
          }
          const uintptr_t out = At(a.out) + dst * row_bytes;
          const uintptr_t want = ranks[r].result + (ar ? x_row : row_in_block) * row_bytes;
          EXPECT(out == want, "%s rank %d: row %lld stored off its place in the result", what, r, (long long)x_row);
          EXPECT(At(a.add_from) + dst * row_bytes == ranks[r].recv + row_in_block * row_bytes,
                 "%s rank %d: row %lld adds from off its place in recv", what, r, (long long)x_row);
          if (ar) {  // the mirror: the peer's result (posted address) + mirror_offset + offset
            EXPECT(ranks[peer].result + a.mirror_offset + dst * row_bytes == ranks[peer].result + x_row * row_bytes,
                   "%s rank %d: row %lld mirrored off its place in the peer's result", what, r, (long long)x_row);
          }
        }
      }
    }
  }
  // Our counter of band g reaches exactly the tiles the peer's head group g stores.
  for (int r = 0; r < 2; ++r) {
    for (int g = 0; g < G; ++g) {
      EXPECT(TilesOf(sched[1 - r], g) == TilesOf(sched[r], G + g), "rank %d band %d: peer stores %d tiles, we wait for %d",
             r, g, TilesOf(sched[1 - r], g), TilesOf(sched[r], G + g));
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  int cases = 0;
  for (int t = 0; t < 400; ++t) {
    const int rows = 1 + int(rng() % 3000);
    const int n = 8 * (1 + int(rng() % 300));
    const int G = 1 + int(rng() % std::min(32, rows));
    std::vector<int> cuts;
    while (int(cuts.size()) < G - 1) {
      const int c = 1 + int(rng() % (rows > 1 ? rows - 1 : 1));
      bool seen = c >= rows;
      for (int x : cuts) seen |= x == c;
      if (!seen) cuts.push_back(c);
    }
    std::sort(cuts.begin(), cuts.end());
    std::vector<int> bands = {0};
    bands.insert(bands.end(), cuts.begin(), cuts.end());
    bands.push_back(rows);
    for (const int* shape : {(const int[]){128, 256, 2}, (const int[]){128, 128, 1}}) {
      for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
        CheckCase(rows, n, bands, shape[0], shape[1], shape[2], kind);
        ++cases;
      }
    }
  }
  std::printf("peer reduce layout: %d cases, %d failure(s)\n", cases, g_failures);
  return g_failures ? 1 : 0;
}
