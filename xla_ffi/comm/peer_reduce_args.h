// The one signaling-GEMM launch of a peer-reduce call (peer_reduce.h, step 2) as launch
// arguments: which rows go where, which counters each group signals and waits for. Pure host
// code on plain pointers (no CUDA call), so tests/cuda/peer_reduce_layout_test.cc checks every
// tile's addresses on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// A rank's signal words (PeerReduceRank::signals), int32 slots, written by its peer.
constexpr int kPeerArrived = 0;              // [kMaxGroups] tiles of our block's partial stored in recv
// [kMaxGroups, 2 * kMaxGroups): unused since the all-reduce's per-tile counters gave way to
// kPeerDone (kept free so the layout, mirrored in jax_flashoverlap/comm.py, stays).
constexpr int kPeerCredit = 2 * kMaxGroups;  // calls the peer has finished
// Non-zero once either side of the pair failed (EnqueueBreakPair): every wait for the peer ends.
constexpr int kPeerFailed = 2 * kMaxGroups + 1;
// 3 words, 8-byte aligned: the peer's result (low, high), then the call that posted it
// (SignalingGemmArgs::mirror_slot).
constexpr int kPeerMailbox = 2 * kMaxGroups + 2;
// All-reduce: the last call whose GEMM the peer finished (its mirror stores into our result
// are complete): a call number, never reset.
constexpr int kPeerDone = 2 * kMaxGroups + 5;
constexpr int kPeerSignalWords = 2 * kMaxGroups + 6;

enum class PeerReduceKind { kAllReduce, kReduceScatter };

// Where one rank's launch reads and writes: its own recv and signals, the peer's. `recv`
// holds rows_per_block x N elements of the GEMM's dtype at least; `signals` kPeerSignalWords
// int32, zeroed once before the first call (the counters are reset by every call, the credit
// counts calls). The peer_* pointers are the peer's recv and signals as this rank's kernels
// and streams address them (the same device, or a peer device with peer access enabled).
struct PeerReduceBuffers {
  int rank = 0;  // 0 or 1
  const void* recv = nullptr;
  int32_t* signals = nullptr;
  void* peer_recv = nullptr;
  int32_t* peer_signals = nullptr;
};

// `base` moved back by `bytes`: the address the kernel adds a row's offset to, for buffers
// that hold only some rows of the launch's output (never dereferenced outside them).
template <class T>
T* PeerRowsBase(T* base, size_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) - bytes);
}

// The launch: both row blocks of `gemm` (m = M, layout = the bands of one block), the peer's
// first (row rotation). The peer's bands are head groups, stored into the peer's recv and
// counted in its `arrived` counters; ours add the peer's partial from our recv once our
// `arrived` counters are complete and go to our rows of `result`; an all-reduce also
// mirror-stores them into the peer's result (address from our mailbox, stamped `call`; the
// stream says when they are complete: kPeerDone). Every wait for the peer also ends once our
// kPeerFailed word is set. The caller has validated `gemm` (peer_reduce.cc).
inline SignalingGemmArgs PeerReduceLaunchArgs(const PeerReduceBuffers& b, PeerReduceKind kind,
                                              const SignalingGemmArgs& gemm, void* result,
                                              int32_t call) {
  const bool all_reduce = kind == PeerReduceKind::kAllReduce;
  const int64_t rows = gemm.m / 2;
  const size_t row_bytes = static_cast<size_t>(gemm.n) * 2;
  const int peer = 1 - b.rank;
  const size_t own_rows_at = b.rank * rows * row_bytes, peer_rows_at = peer * rows * row_bytes;
  const int bands = gemm.layout.num_groups;
  SignalingGemmArgs fused = gemm;
  fused.row_rotation = static_cast<int>(peer * rows);
  fused.layout.num_groups = 2 * bands;
  for (int g = 0; g <= bands; ++g)
    fused.layout.band_rows[bands + g] = static_cast<int>(rows + gemm.layout.band_rows[g]);
  fused.head_groups = bands;
  fused.head_out = PeerRowsBase(static_cast<char*>(b.peer_recv), peer_rows_at);
  fused.head_counters = b.peer_signals + kPeerArrived;
  fused.out = all_reduce ? result : PeerRowsBase(static_cast<char*>(result), own_rows_at);
  fused.add_from = PeerRowsBase(static_cast<const char*>(b.recv), own_rows_at);
  fused.add_sources = 1;
  fused.add_counters = b.signals + kPeerArrived;
  fused.counters = nullptr;
  fused.signal_system = false;
  fused.peer_failed = b.signals + kPeerFailed;
  if (all_reduce) {
    fused.mirror_slot = b.signals + kPeerMailbox;
    fused.mirror_offset = 0;  // our rows of the peer's result sit where they sit in ours
    fused.mirror_call = call;
  }
  return fused;
}

}  // namespace flashoverlap
