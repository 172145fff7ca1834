// NCCL communicators of jax_flashoverlap, separate from XLA's, and what each one owns:
// a high-priority communication stream, the events joining it to XLA's stream, the group
// counters, and a persistent workspace from ncclMemAlloc registered once as a symmetric
// window (DESIGN.md: what lets NCCL run beside the GEMM on few SMs).
//
// Registry key: (comm_id, device ordinal). comm_id names the communicators of one mesh axis
// (the same in every device's copy of the SPMD program); the device ordinal picks this
// device's communicator within its group. Created on the host before any handler runs
// (never lazily inside an execute handler), destroyed at exit.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "xla_ffi/comm/peer_access.h"
#include "xla_ffi/comm/peer_ipc.h"
#include "xla_ffi/comm/peer_reduce.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/comm/stream_write.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

struct Communicator {
  int64_t comm_id = 0;
  // The local members of one group (one CreateCommunicators call) share it: a comm_id names
  // every group of a mesh axis (e.g. the rows of a 2-D mesh), this one of them.
  int64_t group_serial = 0;
  int device = -1;
  int rank = -1;
  int world_size = 0;
  int comm_sms = 0;          // NCCL maxCTAs; the GEMM leaves this many SMs free
  int cta_policy = 0;        // ncclConfig_t.CTAPolicy: NCCL_CTA_POLICY_DEFAULT/EFFICIENCY/ZERO
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;        // communication stream (high priority)
  // All-reduce results are copied from the workspace to XLA's output on their own stream
  // (copy engine), so group g's copy overlaps group g+1's all-reduce.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t group_reduced[kMaxGroups] = {};  // comm stream -> copy stream, per group
  cudaEvent_t copies_done = nullptr;           // copy stream -> compute stream
  cudaEvent_t gemm_started = nullptr;   // compute stream -> comm stream
  cudaEvent_t queue_reset = nullptr;    // the GEMM's queue reset -> its helper launches
  cudaEvent_t comm_done = nullptr;      // comm stream -> compute stream
  // compute stream -> comm stream, after a call whose whole sequence runs on the compute
  // stream (peer stores): the watchdog's check and `done` then follow the sequence.
  cudaEvent_t sequence_done = nullptr;
  // On the compute stream after the last call joined back (FinishCall): once complete, no
  // call of this communicator uses its workspace (quiesce.h).
  cudaEvent_t call_done = nullptr;
  int32_t* counters = nullptr;          // kMaxGroups group counters (device memory)
  void* gemm_queue = nullptr;           // the signaling GEMM's tile queue (kGemmQueueBytes)
  // Collectives: ncclMemAlloc'd and registered as a symmetric window (NCCL runs beside the
  // GEMM on few SMs). Point-to-point (peer_to_peer): plain cudaMalloc, never registered:
  // NCCL 2.28's ncclSend out of a registered window hung on 2 x H200 (it ran with
  // NCCL_LOCAL_REGISTER=0; benchmarks/results/logs/a2a_register_hang_055d72c/).
  // Read by a call only under call_mutex (UseWorkspace), swapped by EnsureWorkspace only under
  // every member's call_mutex with no call in flight (quiesce.h); freed by
  // DestroyCommunicators the same way.
  void* workspace = nullptr;
  bool peer_to_peer = false;
  size_t workspace_bytes = 0;
  ncclWindow_t window = nullptr;
  std::string workspace_error;          // why the last allocation failed (none: empty)
  WaitMethod wait_method = WaitMethod::kStreamOp;
  WriteMethod write_method = WriteMethod::kStreamOp;  // flag writes (all-gather, peer stores)
  std::mutex call_mutex;                // one overlapped call at a time per communicator
  // Watchdog (watchdog.h): off when watchdog_seconds == 0.
  double watchdog_seconds = 0;
  volatile int* abort_flag = nullptr;   // host-mapped; set by the watchdog, read by kernels
  cudaEvent_t watch_started = nullptr;  // the current call's start (WatchStart .. WatchCall)
  std::atomic<bool> aborted{false};     // ncclCommAbort'ed: `comm` is gone
  // DestroyCommunicators released what this communicator owned. The object itself is kept
  // (never freed): a handler that found it just before may still lock call_mutex, and then
  // refuses (BeginCall); a watchdog abort that fired just before returns.
  std::atomic<bool> destroyed{false};
  bool p2p_connected = false;           // ConnectPeers done (set under every member's call_mutex)
  // Peer stores (peer_stores.h; every rank of the group in this process): this member's recv
  // buffer (peer_recv_bytes) and signal words, and the other members', in `peer`. Read by a
  // call only under call_mutex; swapped only as the workspace is (every member's call_mutex,
  // no call in flight). Null peer.buffers.recv: none.
  PeerReduceRank peer;
  size_t peer_recv_bytes = 0;
  bool peer_access = false;  // cudaDeviceEnablePeerAccess to every other member done
  // XLA's allocations found writable by every other member (an all-reduce in this process
  // mirrors into the others' results: peer_access.h); read and extended under call_mutex.
  WritableRanges peer_writable_results;
  // A result the others may not write is first given them (GrantPeersWrite: the user's
  // JAX_FLASHOVERLAP_GRANT_PEER_ACCESS, set at lowering by EnsurePeerStores).
  std::atomic<bool> peer_grant_results{false};
  // Grant mode was on at some call (under call_mutex): peer_writable_results is no longer used.
  bool peer_results_granted = false;
  // The group's members by rank, this one included (communicators are never freed).
  Communicator* peer_members[kMaxPeerRanks] = {};
  // A peer-store call failed: the others may wait for this call's stores for ever, so every
  // later peer-store call of every member refuses (the process must restart).
  std::atomic<bool> peer_broken{false};
  // A group spanning processes (one member per process, peer_ipc.h; peer.buffers.mirror_staged
  // says so): how many times this member's recv was allocated (its records' generation), the
  // other ranks' buffers as opened here, and whether `peer` points at their current
  // generations (calls refuse until then).
  uint64_t peer_generation = 0;
  PeerMappings peer_mapped;
  bool peer_connected = false;
};

// One local member of a group: its rank in the group and its CUDA device ordinal.
struct LocalRank {
  int rank;
  int device;
};

// Creates the communicators of one group for all its local ranks (ncclGroupStart/End around
// ncclCommInitRankConfig per device), with maxCTAs = minCTAs-cap comm_sms, and a registered
// workspace of `workspace_bytes` each (peer_to_peer: ops using ncclSend/ncclRecv, whose
// workspace is not registered with NCCL). Fails if (comm_id, device) already exists. A
// failure before the workspace leaves nothing behind (the NCCL communicators are aborted);
// a failed workspace keeps the communicators without one (EnsureWorkspace can retry;
// jax_flashoverlap.comm destroys them: a comm_id's groups all made or none).
// watchdog_seconds > 0 turns the watchdog on for these communicators (watchdog.h).
// cta_policy: ncclConfig_t.CTAPolicy (0 default, 1 efficiency, 2 zero; NCCL >= 2.27).
Status CreateCommunicators(int64_t comm_id, const ncclUniqueId& id, int world_size,
                           const std::vector<LocalRank>& local, int comm_sms,
                           size_t workspace_bytes, double watchdog_seconds = 0,
                           bool peer_to_peer = false, int cta_policy = 0);

// Grows the workspaces of every local communicator of comm_id to at least `bytes`
// (collective over the group: call it for all local devices of a group at once). All or
// nothing: after a failure no local member has a workspace (each records the error), so
// their handlers all refuse instead of some enqueueing NCCL calls the others never join.
// Safe while other threads run calls on these communicators: it first waits, for at most
// kGrowWaitSeconds, until none of their calls is in flight and holds them off (quiesce.h);
// calls enqueued before use the old buffers, calls after the new ones.
constexpr double kGrowWaitSeconds = 600;
Status EnsureWorkspace(int64_t comm_id, size_t bytes);

// Per-member buffers (workspaces, peer stores) grow in 8 MiB steps: fewer swaps (and window
// re-registrations) as shapes vary.
inline size_t RoundGrowth(size_t bytes) {
  constexpr size_t kStep = size_t{8} << 20;
  return (bytes + kStep - 1) / kStep * kStep;
}

// How per-member buffers grow (EnsureWorkspace's workspaces, the peer stores): the local
// members of comm_id to `needed` under the admin mutex (false: nothing to do), then, if
// needed, to `grow` with every member's call mutex held and no call in flight (quiesce.h, at
// most kGrowWaitSeconds; else an error starting with `what`), the calling thread's device
// restored after.
using MemberBufferStep = std::function<Status(const std::vector<Communicator*>&)>;
Status GrowMemberBuffers(int64_t comm_id, const char* what,
                         const std::function<bool(const std::vector<Communicator*>&)>& needed,
                         const MemberBufferStep& grow);

// Sets up NCCL's point-to-point connections of every local communicator of comm_id to all
// its peers now (one grouped 1-element send/recv to each, from this thread), so the ops that
// use ncclSend/ncclRecv never make NCCL connect lazily inside a handler, where its blocking
// host-side handshake needs the peer's handler to run at the same time. Collective over the
// group (every process calls it for its local ranks); once per communicator. Holds the
// members as a growth does (GrowMemberBuffers: no call in flight meanwhile). Bounded as the
// setup agreement is (RunBoundedSetupGroup, agreement.h): a peer that never comes gets the
// members aborted after kAgreeWaitSeconds, and the error says to restart.
Status ConnectPeers(int64_t comm_id);
Status ConnectPeers(int64_t comm_id, double wait_seconds, double abort_grace_seconds);

// Runs `step` on the local members of comm_id under the admin mutex (nothing is created,
// grown or destroyed meanwhile); an error if there are none.
Status WithLocalMembers(int64_t comm_id, const MemberBufferStep& step);

// Finds this device's communicator; null if none.
Communicator* FindCommunicator(int64_t comm_id, int device);

bool HasCommunicators(int64_t comm_id);

// Destroys every communicator of comm_id (or all when comm_id == 0). Safe to call twice, and
// while other threads run calls: it first waits (at most kDestroyWaitSeconds) until none of
// their calls is in flight and holds them off (quiesce.h), as EnsureWorkspace does; calls
// after it refuse (no communicator). After a watchdog abort it frees what it can. Best
// effort: goes on past a failure and returns the first.
constexpr double kDestroyWaitSeconds = 60;
Status DestroyCommunicators(int64_t comm_id);

struct CommunicatorSummary {
  int64_t comm_id;
  int device, rank, world_size, comm_sms;
  size_t workspace_bytes;
  std::string wait_method;
  std::string write_method;
  double watchdog_seconds;
  bool aborted;
  bool peer_to_peer;
  int cta_policy;
  std::string workspace_error;  // why the last workspace allocation failed (none: empty)
  size_t peer_recv_bytes;       // peer stores' recv buffer (0: none)
  bool peer_broken;             // a peer-store call failed: the pair refuses (restart)
  bool peer_across_processes;   // its peer-store group spans processes (peer_ipc.h)
  bool peer_staged;             // its all-reduce stages its mirrors (peer_stores.h)
  bool peer_grants;             // it grants the others access to its results (peer_access.h)
  bool peer_connected;          // its peer stores point at every other rank's current buffers
};
std::vector<CommunicatorSummary> ListCommunicators();

}  // namespace flashoverlap
