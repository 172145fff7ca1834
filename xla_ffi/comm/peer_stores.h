// Peer stores' buffers on a communicator (docs/DESIGN.md, "Peer stores"): for a group of 2 to
// 8 ranks whose devices are all in this process, each member's `recv` buffer (the next
// rank's running sums land there, at their block's rows) and its signal words, with peer
// access enabled between every two members and each member's PeerReduceRank pointing at the
// others'. Sized at lowering, grown like the workspace (every member's call mutex held, no
// call in flight), freed with the communicator.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// Gives the local members of comm_id peer-store buffers of at least `recv_bytes` each
// (PeerRecvBlocks(world) x the rows per block x N x the element size). Needs 2 to
// kMaxPeerRanks ranks, all local, on distinct devices that can access each other. The signal words survive a
// growth (they count calls). Errors name the reason; on failure no member keeps a buffer.
Status EnsurePeerStores(int64_t comm_id, size_t recv_bytes);

// One GPU's stand-in for a group of 2, for tests (tests/cuda/overlap_harness.cc; not reachable from
// Python): the one rank of a world-1 communicator made its own peer, its peer stores landing
// in its own recv buffer (the kernels' self-peer case, tests/cuda/peer_reduce_test.cu). A
// call then runs everything a pair's does but NVLink: the call frame, growth between calls,
// the watchdog's waits. Its result's block 0 is x[block 0] @ w + x[block 1] @ w; an
// all-reduce leaves block 1 unwritten (the peer's to write).
Status EnsurePeerStoresLoopback(int64_t comm_id, size_t recv_bytes);

// After a failed peer-store call: every member refuses every later one (peer_broken).
void MarkPeerStoresBroken(Communicator& c);

// Frees `c`'s peer-store buffers (its device must be current). Called by the communicator's
// release; the other members' pointers to them go with it (the group is destroyed together).
Status FreePeerStores(Communicator& c);

}  // namespace flashoverlap
