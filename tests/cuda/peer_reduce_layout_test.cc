// Host-only check of the peer-reduce launch (xla_ffi/comm/peer_reduce_args.h) against the
// tile schedule the kernel walks (xla_ffi/kernels/tile_schedule.h), no GPU needed:
//   g++ -std=c++17 -O2 -I<cuda>/include -I. tests/cuda/peer_reduce_layout_test.cc -o t && ./t
// For random shapes, band layouts, world sizes 2, 3, 4 and 8, both tile shapes, every rank and
// both ops, the ring (docs/DESIGN.md, "Ring reduction"): every tile of another rank's block is
// a head group stored at that block's row of rank r - 1's recv (inside its buffer) and
// counted in r - 1's counter of our queue position and its band; from the second block of the
// queue on (and for our own block) a tile first adds what rank r + 1 stored at the same row of
// our recv, waiting for our counter of the position before and its band, which rank r + 1's
// head group of that block and band fills with exactly as many tiles; the first block adds
// nothing; every tile of ours is stored at its row of our result and, for an all-reduce,
// mirrored at its row of every other rank's result, or, staged (ranks in processes of their
// own), at its block's place in every other rank's staging area, which each rank copies into
// its result around its own block. Addresses are plain numbers here (never dereferenced). Exit
// code 1 on any failure.
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

// Where rank q's recv holds the running sum of block b's row i (recv laid out by block), or
// fails the check when that is outside its buffer or the block is one q is never passed.
uintptr_t RecvRow(const std::vector<Rank>& ranks, int q, int b, int64_t i, int world, size_t block_bytes,
                  size_t row_bytes) {
  const int at = b - PeerRecvFirstBlock(q, world);
  EXPECT(at >= 0 && at < PeerRecvBlocks(world) && b != (q + 1) % world,
         "world %d: block %d at %d of rank %d's recv (%d blocks)", world, b, at, q, PeerRecvBlocks(world));
  return ranks[q].recv + at * block_bytes + i * row_bytes;
}

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
    const int previous = (r + world - 1) % world;
    for (int d = 0; d < world - 1; ++d) {  // the d-th head block's sums go to rank r - 1
      EXPECT(At(a.head_counters[d]) == ranks[previous].signals + 4 * (kPeerArrived + d * G),
             "%s world %d rank %d: head counters of queue position %d", what, world, r, d);
    }
    EXPECT(a.add_from != nullptr && a.add_sources == 1 && a.head_add_dests == world - 2,
           "%s world %d rank %d: add sources %d, head adds %d", what, world, r, a.add_sources, a.head_add_dests);
    const int add_first_group = H - a.head_add_dests * G;  // as the launcher computes it
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
          // From the second block of the queue on: adds what rank r + 1 passed for this block,
          // once our counter of the position before (the one it stored this block at) is full.
          const bool adds = w.group >= add_first_group;
          EXPECT(adds == (d > 0), "%s world %d rank %d: queue position %d adds %d", what, world, r, d, int(adds));
          if (adds) {
            EXPECT(At(a.add_from) + dst * row_bytes == RecvRow(ranks, r, block, row_in_block, world, block_bytes, row_bytes),
                   "%s world %d rank %d: row %lld adds from off its place in recv", what, world, r, (long long)x_row);
            EXPECT(At(a.add_counters) + 4 * int64_t(w.group - a.head_groups) ==
                       ranks[r].signals + 4 * (kPeerArrived + (d - 1) * G + band),
                   "%s world %d rank %d: group %d waits for the wrong counter", what, world, r, w.group);
          }
          if (head) {
            EXPECT(At(a.head_out[d]) + dst * row_bytes ==
                       RecvRow(ranks, previous, block, row_in_block, world, block_bytes, row_bytes),
                   "%s world %d rank %d: head row %lld stored off its place in rank %d's recv", what, world, r,
                   (long long)x_row, previous);
            continue;
          }
          const uintptr_t out = At(a.out) + dst * row_bytes;
          const uintptr_t want = ranks[r].result + (ar ? x_row : row_in_block) * row_bytes;
          EXPECT(out == want, "%s rank %d: row %lld stored off its place in the result", what, r, (long long)x_row);
          if (ar) {  // mirror s: the result rank SlotSource posted there + mirror_offset + offset
            for (int slot = 0; slot < world - 1; ++slot) {
              const Rank& to = ranks[SlotSource(r, slot, world)];
              EXPECT(to.result + a.mirror_offset + dst * row_bytes == to.result + x_row * row_bytes,
                     "%s rank %d: row %lld mirrored off its place in rank %d's result", what, r, (long long)x_row,
                     SlotSource(r, slot, world));
            }
            // Staged (ranks in processes of their own): the address this rank writes into its
            // own mailbox for rank `to` + the same offset lands at our block's place in to's
            // staging area, inside it.
            for (int to = 0; to < world; ++to) {
              if (to == r) continue;
              const uintptr_t area = ranks[to].recv + PeerStageOffset(world, block_bytes);
              const uintptr_t got =
                  At(PeerStagedMirrorBase(reinterpret_cast<void*>(ranks[to].recv), r, to, world, block_bytes)) +
                  a.mirror_offset + dst * row_bytes;
              EXPECT(got == area + PeerStagePosition(r, to) * block_bytes + row_in_block * row_bytes &&
                         got + row_bytes <= area + PeerStageBlocks(world) * block_bytes,
                     "%s world %d rank %d: row %lld staged off its place in rank %d's staging area", what, world, r,
                     (long long)x_row, to);
            }
          }
        }
      }
    }
  }
  // Our counter of position p, band g (what we wait for at position p + 1) reaches exactly the
  // tiles rank r + 1's head group at position p, band g stores, of the same block; and the
  // signal-word slots give every other rank its own.
  for (int r = 0; r < world; ++r) {
    const int next = (r + 1) % world;
    for (int p = 0; p + 1 < world; ++p) {
      for (int g = 0; g < G; ++g) {
        EXPECT(TilesOf(sched[next], p * G + g) == TilesOf(sched[r], (p + 1) * G + g),
               "world %d rank %d band %d: rank %d stores %d tiles at position %d, we wait for %d", world, r, g, next,
               TilesOf(sched[next], p * G + g), p, TilesOf(sched[r], (p + 1) * G + g));
      }
    }
    std::vector<int> seen(world - 1, 0);
    for (int slot = 0; slot < world - 1; ++slot) {
      const int from = SlotSource(r, slot, world);
      EXPECT(from != r && PeerSlot(from, r, world) == slot, "world %d rank %d: slot %d's source %d", world, r, slot,
             from);
      ++seen[PeerSlot(from, r, world)];
    }
    for (int x : seen) EXPECT(x == 1, "world %d rank %d: slots not one per rank", world, r);
    // The staged copy-out: every other block once, from its staging position to its place in
    // the result, never over our own block.
    if (ar) {
      PeerStagedCopy copies[2];
      const int count = PeerStagedCopies(r, world, block_bytes, copies);
      std::vector<int> copied(world, 0);
      size_t total = 0;
      for (int c = 0; c < count; ++c) {
        total += copies[c].bytes;
        for (size_t off = 0; off < copies[c].bytes; off += block_bytes) {
          const int block = int((copies[c].to + off) / block_bytes);
          EXPECT(block != r && PeerStagePosition(block, r) * block_bytes == copies[c].from + off,
                 "world %d rank %d: staged copy %d puts position %zu at block %d", world, r, c,
                 (copies[c].from + off) / block_bytes, block);
          if (block >= 0 && block < world) ++copied[block];
        }
      }
      for (int b = 0; b < world; ++b)
        EXPECT(copied[b] == (b == r ? 0 : 1), "world %d rank %d: block %d copied %d times", world, r, b, copied[b]);
      EXPECT(total == PeerStageBlocks(world) * block_bytes, "world %d rank %d: %zu bytes copied", world, r, total);
    }
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
