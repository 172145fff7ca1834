// Peer stores' buffers on a communicator (docs/DESIGN.md, "Peer stores"): for a group of 2 to
// 8 ranks whose devices are all in this process (or one per process, below), each member's `recv` buffer (the next
// rank's running sums land there, at their block's rows) and its signal words, with peer
// access enabled between every two members and each member's PeerReduceRank pointing at the
// others'. Sized at lowering, grown like the workspace (every member's call mutex held, no
// call in flight), freed with the communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// Gives the local members of comm_id peer-store buffers of at least `recv_bytes` each
// (PeerRecvBlocks(world) x the rows per block x N x the element size). Needs 2 to
// kMaxPeerRanks ranks, all local, on distinct devices that can access each other, or one local
// rank of such a group (the others in other processes: ImportPeerStores next). The signal
// words survive a growth (they count calls). Errors name the reason; on failure no member
// keeps a buffer. `stage_mirrors`: an all-reduce of a group in this process mirrors its
// reduced blocks into the others' staging areas (our buffers, so `recv_bytes` must hold them)
// and each copies them out, instead of storing straight into the others' XLA results: for
// when XLA's memory is not writable by the other GPUs (peer_access.h; Python asks first,
// comm.peer_results_writable). A group spanning processes always stages. A member whose
// buffers were made with the other setting is grown anew. `grant_results` (the user's
// JAX_FLASHOVERLAP_GRANT_PEER_ACCESS): an unstaged all-reduce gives the other members access
// to a result they may not write (GrantPeersWrite) instead of failing the call.
Status EnsurePeerStores(int64_t comm_id, size_t recv_bytes, bool stage_mirrors = false,
                        bool grant_results = false);

// A group spanning processes (one rank per process, all on one host; docs/DESIGN.md, "Peer
// stores across processes"): EnsurePeerStores allocates this process's member's buffers only;
// its calls refuse until ImportPeerStores has opened every other rank's. Collective: after each
// EnsurePeerStores every process exports its members' records, hands them to the others (the
// caller's transport: JAX's key-value store), and imports its groups' records.
struct PeerStoresRecord {
  int device;
  int rank;
  std::string bytes;  // peer_ipc.h's record
};
Status ExportPeerStores(int64_t comm_id, std::vector<PeerStoresRecord>* records);

// Before a growth of such a group (EnsurePeerStores to more than its members hold): closes
// this process's mappings of the other ranks' recv buffers (no call in flight), so that each
// owner may free its own once every process has done this (a barrier between the two: CUDA
// leaves an exporter's free before the importers' close undefined). Calls refuse until
// ImportPeerStores. Nothing happens where the buffers are large enough (every process of the
// group decides alike: the same programs lowered in the same order).
Status ReleasePeerStores(int64_t comm_id, size_t recv_bytes);

// Opens, for each local member (by device), its group's records (by rank, its own included):
// no call in flight meanwhile (GrowMemberBuffers). Checks that every rank is on its own GPU and
// that the buffers are of one size; closes the buffers a rank replaced. Nothing happens when
// every member already holds these generations.
Status ImportPeerStores(int64_t comm_id, const std::map<int, std::vector<std::string>>& records_by_device);

// One GPU's stand-in for a group of 2, for tests (tests/cuda/overlap_harness.cc; not reachable from
// Python): the one rank of a world-1 communicator made its own peer, its peer stores landing
// in its own recv buffer (the kernels' self-peer case, tests/cuda/peer_reduce_test.cu). A
// call then runs everything a pair's does but NVLink: the call frame, growth between calls,
// the watchdog's waits. Its result's block 0 is x[block 0] @ w + x[block 1] @ w; an
// all-reduce leaves block 1 unwritten (the peer's to write).
Status EnsurePeerStoresLoopback(int64_t comm_id, size_t recv_bytes, bool stage_mirrors = false);

// After a failed peer-store call: every member refuses every later one (peer_broken).
void MarkPeerStoresBroken(Communicator& c);

// Frees `c`'s peer-store buffers (its device must be current). Called by the communicator's
// release; the other members' pointers to them go with it (the group is destroyed together).
Status FreePeerStores(Communicator& c);

}  // namespace flashoverlap
