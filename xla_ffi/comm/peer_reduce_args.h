// The one signaling-GEMM launch of a peer-reduce call (peer_reduce.h, step 2) as launch
// arguments: which rows go where, which counters each group signals and waits for. Pure host
// code on plain pointers (no CUDA call), so tests/cuda/peer_reduce_layout_test.cc checks every
// tile's addresses on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// Most ranks of a peer-store group (the GPUs of one node): a launch has one head destination
// per other rank's block and, for an all-reduce, one mirror per other rank
// (SignalingGemmArgs::head_out, mirror_slots: kMaxAddSources each).
constexpr int kMaxPeerRanks = kMaxAddSources + 1;

// Where rank `to`'s signal words (credit, done, mailbox) keep what rank `from` tells it: one
// slot per other rank, counted from the rank after `to` (so in a group of 2 every slot is 0,
// and a rank that is its own peer reads what it wrote). The partial sums come from rank
// to + 1 only (the ring): their `arrived` counters are numbered by queue position instead,
// their place in recv by block (PeerReduceLaunchArgs).
constexpr int PeerSlot(int from, int to, int world) { return ((from - to - 1) % world + world) % world; }

// A rank's signal words (PeerReduceRank::signals), int32, written by the other ranks (slot s:
// the rank PeerSlot gives s for; `arrived`: by rank + 1 only).
// [slot * bands + band]: tiles of band `band` that rank + 1 stored into our recv at its queue
// position `slot` (the running sums of block rank + 2 + slot, at that block's rows)
constexpr int kPeerArrived = 0;
constexpr int kPeerArrivedWords = kMaxGroups;
constexpr int kPeerCredit = kPeerArrived + kPeerArrivedWords;  // [slot]: calls that rank has finished
// [slot], all-reduce: the last call whose GEMM that rank finished (its mirror stores into our
// result are complete): a call number, never reset.
constexpr int kPeerDone = kPeerCredit + kMaxPeerRanks;
// [slot] 4 words each, 8-byte aligned: that rank's result (low, high), then the call that
// posted it (SignalingGemmArgs::mirror_slots).
constexpr int kPeerMailbox = kPeerDone + kMaxPeerRanks;
constexpr int kPeerMailboxWords = 4;
// Non-zero once any rank of the group failed (EnqueueBreakPeers): every wait for the others ends.
constexpr int kPeerFailed = kPeerMailbox + kPeerMailboxWords * kMaxPeerRanks;
constexpr int kPeerSignalWords = kPeerFailed + 1;
static_assert(kPeerMailbox % 2 == 0, "the mailboxes hold pointers");

enum class PeerReduceKind { kAllReduce, kReduceScatter };

// Where one rank's launch reads and writes: its own recv and signals, the other ranks'.
// `recv` holds PeerRecvBlocks(world) blocks of rows_per_block x N elements of the GEMM's dtype
// at least (PeerRecvFirstBlock); `signals` kPeerSignalWords int32, zeroed once before the
// first call (the counters are reset by every call, the other words count calls). peers_recv[i] / peers_signals[i] are
// rank i's recv and signals as this rank's kernels and streams address them (the same device,
// or a peer device with peer access enabled); [rank] is unused, except in a rank that is its
// own peer (world 2, both entries its own buffers: tests).
struct PeerReduceBuffers {
  int rank = 0;   // 0 .. world - 1
  int world = 2;  // 2 .. kMaxPeerRanks
  const void* recv = nullptr;
  int32_t* signals = nullptr;
  void* peers_recv[kMaxPeerRanks] = {};
  int32_t* peers_signals[kMaxPeerRanks] = {};
  // The other ranks' results are not addressable here (they live in other processes,
  // peer_ipc.h): an all-reduce mirror-stores our block into each rank's staging area (its
  // recv, after the running sums: PeerStageOffset) and copies the others' blocks from ours
  // into the result once they are complete (peer_reduce.h, step 3).
  bool mirror_staged = false;
};


// `base` moved back by `bytes`: the address the kernel adds a row's offset to, for buffers
// that hold only some rows of the launch's output (never dereferenced outside them).
template <class T>
T* PeerRowsBase(T* base, size_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) - bytes);
}

// Rank r's recv holds the running sums rank r + 1 passes it, at block b's rows for block b
// (laid out like the GEMM's output, so the kernel's one add_from serves every block): every
// block but r + 1's (which rank r + 1 keeps), so from block PeerRecvFirstBlock on, for
// PeerRecvBlocks blocks at most (a group of 2: the one block r; of more: every block, the one
// of r + 1 unused).
constexpr int PeerRecvFirstBlock(int rank, int world) { return rank == world - 1 ? 1 : 0; }
constexpr int PeerRecvBlocks(int world) { return world == 2 ? 1 : world; }

// A staged all-reduce's staging area: the world - 1 blocks of the other ranks, in rank order
// without our own, starting PeerStageOffset bytes into recv; block `block` of a rank other
// than `owner` sits at position PeerStagePosition there.
constexpr int PeerStageBlocks(int world) { return world - 1; }
constexpr size_t PeerStageOffset(int world, size_t block_bytes) { return PeerRecvBlocks(world) * block_bytes; }
constexpr int PeerStagePosition(int block, int owner) { return block < owner ? block : block - 1; }

// The address rank `from` mirror-stores into for rank `to` (staged): the kernel adds our rows'
// offset in the result (from * block_bytes), so the base is moved back to where block 0 would
// sit if the staging area held every block at its own place.
inline void* PeerStagedMirrorBase(void* to_recv, int from, int to, int world, size_t block_bytes) {
  const size_t back = (from - PeerStagePosition(from, to)) * block_bytes;  // 0 or one block
  return PeerRowsBase(static_cast<char*>(to_recv) + PeerStageOffset(world, block_bytes), back);
}

// The staging area's copy into `rank`'s result once complete (byte offsets from the area's
// start and the result's): the blocks before ours, then those after it (one or two copies).
struct PeerStagedCopy {
  size_t from, to, bytes;
};
inline int PeerStagedCopies(int rank, int world, size_t block_bytes, PeerStagedCopy copies[2]) {
  int count = 0;
  if (rank > 0) copies[count++] = {0, 0, rank * block_bytes};
  if (rank < world - 1) {
    copies[count++] = {rank * block_bytes, (rank + 1) * block_bytes, (world - 1 - rank) * block_bytes};
  }
  return count;
}

// The launch: all world row blocks of `gemm` (m = M, layout = the bands of one block), the
// ranks after ours first, ours last (row rotation), reduced along a ring (docs/DESIGN.md,
// "Ring reduction"): block b is computed by rank b - 1 at queue position 0, by b - 2 at
// position 1, ..., by b itself last, so at every position a rank adds the partial its next
// rank (r + 1) passed it to its own and passes the sum on to its previous rank (r - 1).
// Queue position d (block r + 1 + d) is head destination d: stored into rank r - 1's recv
// (at that block's rows) and counted in its `arrived` counters [d * bands, (d + 1) * bands);
// from position 1 on it first adds what rank r + 1 stored for that block into our recv
// (head_add_dests) once our `arrived` counters of position d - 1 are complete. Our own block
// (position world - 1) adds the same way and goes to our rows of `result`; an all-reduce also
// mirror-stores it into every other rank's result (addresses from our mailboxes, stamped
// `call`; the stream says when they are complete: kPeerDone). Every wait for the others also
// ends once our kPeerFailed word is set. In a group of 2 this is one head destination that
// adds nothing and our block adding what the other rank stored: the same addresses as before
// the ring. The caller has validated `gemm` (peer_reduce.cc).
inline SignalingGemmArgs PeerReduceLaunchArgs(const PeerReduceBuffers& b, PeerReduceKind kind,
                                              const SignalingGemmArgs& gemm, void* result,
                                              int32_t call) {
  const bool all_reduce = kind == PeerReduceKind::kAllReduce;
  const int world = b.world;
  const int64_t rows = gemm.m / world;
  const size_t row_bytes = static_cast<size_t>(gemm.n) * 2;
  const size_t block_bytes = rows * row_bytes;
  const int bands = gemm.layout.num_groups;
  const int previous = (b.rank + world - 1) % world;  // where our running sums go
  SignalingGemmArgs fused = gemm;
  fused.row_rotation = static_cast<int>(((b.rank + 1) % world) * rows);
  fused.layout.num_groups = world * bands;
  for (int d = 1; d < world; ++d)
    for (int g = 0; g <= bands; ++g)
      fused.layout.band_rows[d * bands + g] = static_cast<int>(d * rows + gemm.layout.band_rows[g]);
  fused.head_groups = (world - 1) * bands;
  fused.head_dests = world - 1;
  // Every block's sums go to the same place in rank r - 1's recv (laid out by block): one base.
  char* previous_recv = PeerRowsBase(static_cast<char*>(b.peers_recv[previous]),
                                     PeerRecvFirstBlock(previous, world) * block_bytes);
  for (int d = 0; d < world - 1; ++d) {  // the d-th block of the queue
    fused.head_out[d] = previous_recv;
    fused.head_counters[d] = b.peers_signals[previous] + kPeerArrived + d * bands;
  }
  fused.head_add_dests = world - 2;  // all but the first block add what rank + 1 passed us
  fused.out = all_reduce ? result : PeerRowsBase(static_cast<char*>(result), b.rank * block_bytes);
  fused.add_from = PeerRowsBase(static_cast<const char*>(b.recv), PeerRecvFirstBlock(b.rank, world) * block_bytes);
  fused.add_stride = 0;
  fused.add_sources = 1;
  // Group g at queue position g / bands >= 1 waits for add_counters[g - head_groups]: our
  // `arrived` counters of position g / bands - 1 (what rank + 1 stored there), band g % bands.
  fused.add_counters = b.signals + kPeerArrived + (world - 2) * bands;
  fused.counters = nullptr;
  fused.signal_system = false;
  fused.peer_failed = b.signals + kPeerFailed;
  if (all_reduce) {
    for (int s = 0; s < world - 1; ++s) fused.mirror_slots[s] = b.signals + kPeerMailbox + kPeerMailboxWords * s;
    fused.mirror_count = world - 1;
    fused.mirror_offset = 0;  // our rows of another rank's result sit where they sit in ours
    fused.mirror_call = call;
  }
  return fused;
}

}  // namespace flashoverlap
