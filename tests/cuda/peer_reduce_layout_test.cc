// Host-only check of the peer-reduce launch (xla_ffi/comm/peer_reduce_args.h) against the
// tile schedule the kernel walks (xla_ffi/kernels/tile_schedule.h), no GPU needed:
//   g++ -std=c++17 -O2 -I<cuda>/include -I. tests/cuda/peer_reduce_layout_test.cc -o t && ./t
// For random shapes, band layouts, world sizes 2, 3, 4 and 8, both tile shapes, every rank and
// both ops: every tile of another rank's block is a head group stored at its row of our slot
// of that rank's recv and counted in that rank's counter of our slot and its band; every tile
// of ours is stored at its row of our result, adds the partials at the same row of every slot
// of our recv, waits for our counters of its band (which each other rank's head group of our
// block and that band fills with exactly as many tiles), and, for an all-reduce, is mirrored
// at its row of every other rank's result. Addresses are plain numbers here (never
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

// Far-apart fake addresses, 256-byte aligned.
Rank FakeRank(int r) {
  const uintptr_t base = uintptr_t(r + 1) << 44;
  return {base, base + (uintptr_t(1) << 40), base + (uintptr_t(2) << 40)};
}

// The rank whose messages land in `to`'s slot `slot`.
int SlotSource(int to, int slot, int world) { return (to + 1 + slot) % world; }

void CheckCase(int world, int rows, int n, const std::vector<int>& bands, int bm, int bn, int cm,
               PeerReduceKind kind) {
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int64_t m = int64_t(world) * rows;
  const size_t row_bytes = size_t(n) * 2, block_bytes = size_t(rows) * row_bytes;
  std::vector<Rank> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(FakeRank(r));
  SignalingGemmArgs gemm;
  gemm.m = m;
  gemm.n = n;
  gemm.k = 64;
  gemm.layout.num_groups = int(bands.size()) - 1;
  for (size_t g = 0; g < bands.size(); ++g) gemm.layout.band_rows[g] = bands[g];
  const int G = gemm.layout.num_groups, H = (world - 1) * G;
  const char* what = ar ? "AR" : "RS";
  std::vector<TileSchedule> sched(world);
  for (int r = 0; r < world; ++r) {
    PeerReduceBuffers b;
    b.rank = r;
    b.world = world;
    b.recv = reinterpret_cast<const void*>(ranks[r].recv);
    b.signals = reinterpret_cast<int32_t*>(ranks[r].signals);
    for (int i = 0; i < world; ++i) {
      if (i == r) continue;
      b.peers_recv[i] = reinterpret_cast<void*>(ranks[i].recv);
      b.peers_signals[i] = reinterpret_cast<int32_t*>(ranks[i].signals);
    }
    const SignalingGemmArgs a = PeerReduceLaunchArgs(b, kind, gemm, reinterpret_cast<void*>(ranks[r].result), 9);
    EXPECT(a.layout.num_groups == world * G && a.head_groups == H && a.head_dests == world - 1,
           "%s world %d: groups %d, head %d, dests %d", what, world, a.layout.num_groups, a.head_groups, a.head_dests);
    EXPECT(a.layout.band_rows[world * G] == m, "%s: bands end at %d, M = %lld", what, a.layout.band_rows[world * G],
           (long long)m);
    for (int g = 0; g < world * G; ++g)
      EXPECT(a.layout.band_rows[g] < a.layout.band_rows[g + 1], "%s: band %d empty", what, g);
    if (a.row_rotation != 0) {
      bool boundary = false;
      for (int g = 0; g <= world * G; ++g) boundary |= a.layout.band_rows[g] == m - a.row_rotation;
      EXPECT(boundary, "%s: M - rotation %lld not a band boundary", what, (long long)(m - a.row_rotation));
    }
    for (int d = 0; d < world - 1; ++d) {  // the d-th head block goes to rank r + 1 + d
      const int to = (r + 1 + d) % world;
      EXPECT(At(a.head_counters[d]) == ranks[to].signals + 4 * (kPeerArrived + PeerSlot(r, to, world) * G),
             "%s world %d rank %d: head counters of block %d", what, world, r, to);
    }
    EXPECT(At(a.add_counters) == ranks[r].signals + 4 * kPeerArrived && a.add_sources == world - 1 &&
               a.add_stride == int64_t(block_bytes),
           "%s world %d rank %d: add counters / sources / stride", what, world, r);
    EXPECT(At(a.peer_failed) == ranks[r].signals + 4 * kPeerFailed, "%s rank %d: failed word", what, r);
    EXPECT(a.counters == nullptr && !a.signal_system, "%s rank %d: own tiles signal nothing", what, r);
    if (ar) {
      EXPECT(a.mirror_count == world - 1 && a.mirror_call == 9, "%s world %d rank %d: mirrors %d", what, world, r,
             a.mirror_count);
      for (int s = 0; s < a.mirror_count; ++s) {
        EXPECT(At(a.mirror_slots[s]) == ranks[r].signals + 4 * (kPeerMailbox + kPeerMailboxWords * s) &&
                   At(a.mirror_slots[s]) % 8 == 0,
               "%s rank %d: mailbox %d", what, r, s);
      }
    } else {
      EXPECT(a.mirror_count == 0, "%s rank %d: no mirror stores", what, r);
    }
    const TileSchedule& s = sched[r] = Schedule(a, bm, bn, cm);
    for (int u = 0; u < s.num_units; ++u) {
      for (int rm = 0; rm < s.cluster_m; ++rm) {
        const TileWork w = DecodeUnit(s, u, rm);
        if (w.rows <= 0) continue;
        const bool head = w.group < a.head_groups;
        for (int i = 0; i < w.rows; i += (w.rows > 1 ? w.rows - 1 : 1)) {  // first and last row
          const int64_t x_row = w.src_row + i, dst = w.dst_row + i;
          const int block = int(x_row / rows);
          const int64_t row_in_block = x_row % rows;
          EXPECT(head == (block != r), "%s rank %d: x row %lld (block %d) in group %d, head %d", what, r,
                 (long long)x_row, block, w.group, int(head));
          const int d = head ? w.group / G : world - 1;  // the block's place in the queue
          EXPECT(block == (r + 1 + d) % world, "%s world %d rank %d: group %d covers block %d, queue place %d", what,
                 world, r, w.group, block, d);
          const int band = w.group - d * G;
          EXPECT(band >= 0 && band < G && bands[band] <= row_in_block && row_in_block < bands[band + 1],
                 "%s rank %d: row %lld of its block not in band %d", what, r, (long long)row_in_block, band);
          if (head) {
            const uintptr_t want = ranks[block].recv + PeerSlot(r, block, world) * block_bytes + row_in_block * row_bytes;
            EXPECT(At(a.head_out[d]) + dst * row_bytes == want,
                   "%s world %d rank %d: head row %lld stored off its place in rank %d's recv", what, world, r,
                   (long long)x_row, block);
            continue;
          }
          const uintptr_t out = At(a.out) + dst * row_bytes;
          const uintptr_t want = ranks[r].result + (ar ? x_row : row_in_block) * row_bytes;
          EXPECT(out == want, "%s rank %d: row %lld stored off its place in the result", what, r, (long long)x_row);
          for (int src = 0; src < world - 1; ++src) {
            EXPECT(At(a.add_from) + src * a.add_stride + dst * row_bytes ==
                       ranks[r].recv + src * block_bytes + row_in_block * row_bytes,
                   "%s rank %d: row %lld adds slot %d from off its place in recv", what, r, (long long)x_row, src);
          }
          if (ar) {  // mirror s: the result rank SlotSource posted there + mirror_offset + offset
            for (int slot = 0; slot < world - 1; ++slot) {
              const Rank& to = ranks[SlotSource(r, slot, world)];
              EXPECT(to.result + a.mirror_offset + dst * row_bytes == to.result + x_row * row_bytes,
                     "%s rank %d: row %lld mirrored off its place in rank %d's result", what, r, (long long)x_row,
                     SlotSource(r, slot, world));
            }
          }
        }
      }
    }
  }
  // Our counter of slot s, band g reaches exactly the tiles its source's head group of our
  // block and band g stores, and every other rank has its own slot.
  for (int r = 0; r < world; ++r) {
    std::vector<int> seen(world - 1, 0);
    for (int slot = 0; slot < world - 1; ++slot) {
      const int from = SlotSource(r, slot, world);
      EXPECT(from != r && PeerSlot(from, r, world) == slot, "world %d rank %d: slot %d's source %d", world, r, slot,
             from);
      ++seen[PeerSlot(from, r, world)];
      const int d = ((r - from - 1) % world + world) % world;  // our block's place in its queue
      for (int g = 0; g < G; ++g) {
        EXPECT(TilesOf(sched[from], d * G + g) == TilesOf(sched[r], H + g),
               "world %d rank %d band %d: rank %d stores %d tiles, we wait for %d", world, r, g, from,
               TilesOf(sched[from], d * G + g), TilesOf(sched[r], H + g));
      }
    }
    for (int x : seen) EXPECT(x == 1, "world %d rank %d: slots not one per rank", world, r);
  }
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  int cases = 0;
  for (int t = 0; t < 400; ++t) {
    static const int kWorlds[] = {2, 2, 3, 4, 8};  // world 2 the path in use, twice as often
    const int world = kWorlds[t % 5];
    const int rows = 1 + int(rng() % 3000);
    const int n = 8 * (1 + int(rng() % 300));
    const int G = 1 + int(rng() % std::min(kMaxGroups / world, rows));
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
        CheckCase(world, rows, n, bands, shape[0], shape[1], shape[2], kind);
        ++cases;
      }
    }
  }
  std::printf("peer reduce layout: %d cases, %d failure(s)\n", cases, g_failures);
  return g_failures ? 1 : 0;
}
