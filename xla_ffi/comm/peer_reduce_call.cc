// GEMM + all-reduce / reduce-scatter over the local GPUs of a group by peer stores: the communicator's
// frame around EnqueuePeerReduce (peer_reduce.h), as the NCCL path's calls have it (call
// mutex, ordering after the previous call, watchdog timing, joining back).
#include <string>
#include <vector>

#include "xla_ffi/comm/call_frame.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/comm/peer_access.h"
#include "xla_ffi/comm/peer_reduce.h"
#include "xla_ffi/comm/peer_stores.h"
#include "xla_ffi/comm/stream_wait.h"

namespace flashoverlap {
namespace {

Status CheckPeerStores(const Communicator& comm, const SignalingGemmArgs& gemm, bool all_reduce,
                       const char* op) {
  const std::string where = "(comm_id " + std::to_string(comm.comm_id) + ", device " +
                            std::to_string(comm.device) + ")";
  if (comm.peer_broken) {
    return Status::Error(std::string(op) + ": an earlier peer-store call of this group " + where +
                         " failed; the other ranks may wait for that call's stores for ever: restart the process");
  }
  if (!comm.peer_connected) {
    return Status::Error(std::string(op) + ": the peer-store buffers " + where + " are not "
                         "connected to the group's other ranks (jax_flashoverlap.comm."
                         "ensure_communicators connects them when the op is lowered)");
  }
  const int world = comm.peer.buffers.world;
  // Staged all-reduce (across processes, or XLA's memory not writable by the others): the
  // staging area after the running sums.
  const int blocks = PeerRecvBlocks(world) + (all_reduce && comm.peer.buffers.mirror_staged ? PeerStageBlocks(world) : 0);
  const size_t need = static_cast<size_t>(blocks) * (gemm.m / world) * gemm.n * 2;
  if (comm.peer.buffers.recv == nullptr || comm.peer_recv_bytes < need) {
    return Status::Error(std::string(op) + ": peer-store buffer " + where + " has " +
                         std::to_string(comm.peer_recv_bytes) + " bytes, needs " + std::to_string(need) +
                         " (jax_flashoverlap.comm.ensure_communicators sizes it when the op is lowered)");
  }
  return Status::Ok();
}

// An all-reduce of a group in this process that mirrors straight into the others' results:
// every other member's GPU must be allowed to write ours (XLA's allocator decides, or we
// grant it where the user let us: peer_grant_results; peer_access.h). Checked once per
// allocation (with grants: every call); a result it cannot write is refused here instead of
// faulting in the other GPU's kernel.
Status CheckResultWritable(Communicator& comm, const void* result) {
  std::vector<int> peers;
  for (int i = 0; i < comm.peer.buffers.world; ++i) {
    const Communicator* member = comm.peer_members[i];
    if (member != nullptr && member->device != comm.device) peers.push_back(member->device);
  }
  if (peers.empty()) return Status::Ok();  // loopback, or ranks in other processes (staged)
  // Once grant mode was on, never remember: a range writable through our grant would stay
  // remembered after its allocator mapped it anew, were grant mode then switched off.
  const bool grant = comm.peer_grant_results;
  comm.peer_results_granted = comm.peer_results_granted || grant;
  return CheckPeersMayWrite(result, peers,
                            comm.peer_results_granted ? nullptr : &comm.peer_writable_results,
                            grant);
}

// An injected hang (fault_injection.h): the call waits, as it waits for a peer, for a number
// no rank writes: 3 * 2^29 past this rank's calls, ahead of the others' call numbers (a few
// calls apart) and of a break's (2^30 past its rank's calls). The wait is cyclic and the
// numbers wrap (stream_wait.h): a fixed INT32_MAX was released by a break once the calls
// passed 2^30, and by the call numbers themselves at 2^31.
Status EnqueueInjectedHang(const PeerReduceRank& peer, cudaStream_t stream) {
  const int32_t never_written = static_cast<int32_t>(peer.calls + (3u << 29));
  return EnqueueWaitGeq(stream, peer.buffers.signals + kPeerCredit, never_written, peer.wait_method,
                        peer.abort_flag);
}

}  // namespace

Status RunGemmPeerReduce(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         SignalingGemmArgs gemm, void* result, const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(BeginCall(comm, stream, op));  // destroyed or aborted: nothing to let go
  const PeerReduceKind peer_kind = kind == CollectiveKind::kAllReduce
                                       ? PeerReduceKind::kAllReduce
                                       : PeerReduceKind::kReduceScatter;
  Status status = CheckPeerStores(comm, gemm, kind == CollectiveKind::kAllReduce, op);
  // Broken before: its calls were let go then. Not connected: the other ranks' words are not
  // known here (their import failed at lowering, so no program with this call ran there).
  if (!status.ok() && (comm.peer_broken || !comm.peer_connected)) return status;
  gemm.queue = comm.gemm_queue;  // ordered on `stream`: one call at a time per communicator
  gemm.counters = nullptr;       // EnqueuePeerReduce sets which counters each group signals
  if (status.ok()) {
    status = CatchExceptions([&]() -> Status {
      Status steps = Status::Ok();
      if (kind == CollectiveKind::kAllReduce && !comm.peer.buffers.mirror_staged) {
        steps = CheckResultWritable(comm, result);
      }
      if (steps.ok()) steps = StartCall(comm, stream, /*counters=*/0, /*copies=*/false);
      if (steps.ok()) steps = TakeInjectedFault(comm.device);
      if (steps.ok() && TakeInjectedHang(comm.device)) steps = EnqueueInjectedHang(comm.peer, stream);
      if (steps.ok()) steps = EnqueuePeerReduce(comm.peer, stream, peer_kind, gemm, result);
      // Everything above ran on `stream`: the watchdog's end of the call must follow it.
      if (steps.ok()) steps = FollowOnCommStream(comm, stream);
      return steps;
    });
  }
  if (!status.ok()) {
    // The others may be in this very call or further on (their host threads ahead of ours),
    // and we may have launched part of ours: let every call of the group end.
    Status broken = EnqueueBreakPeers(comm.peer, stream);
    if (!broken.ok()) status.message += " (letting the group's calls end failed too: " + broken.message + ")";
    MarkPeerStoresBroken(comm);
  }
  return FinishCall(comm, stream, /*copies=*/false, status, op);
}

}  // namespace flashoverlap
