#include "xla_ffi/comm/communicator.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "xla_ffi/comm/agreement.h"
#include "xla_ffi/comm/peer_stores.h"
#include "xla_ffi/comm/quiesce.h"
#include "xla_ffi/comm/stream_write.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

using Key = std::pair<int64_t, int>;

// Guards the map only, briefly: a handler's FindCommunicator never waits behind NCCL's init,
// a window registration or a workspace growth waiting for calls to drain.
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

// Serializes what creates, grows, connects, lists or destroys communicators (the only
// writers of the map and of the workspaces): the members a holder sees stay as they are.
std::mutex& AdminMutex() {
  static std::mutex mu;
  return mu;
}

std::map<Key, std::unique_ptr<Communicator>>& Registry() {
  static auto* registry = new std::map<Key, std::unique_ptr<Communicator>>();
  return *registry;
}

// Restores the calling thread's current device on scope exit. Best effort (a destructor has
// no one to tell): a device it could not read is left alone rather than set to 0, and a
// failed restore leaves no stale error behind for the thread's next CUDA call to report.
class DeviceScope {
 public:
  DeviceScope() {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }

 private:
  int previous_ = -1;
};

std::vector<Communicator*> LocalMembers(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<Communicator*> out;
  for (auto& [key, comm] : Registry()) {
    if (comm_id == 0 || key.first == comm_id) out.push_back(comm.get());
  }
  return out;
}


// The workspace's buffer goes back the way it was allocated (AllocateAndRegister).
Status FreeWorkspaceBuffer(Communicator& c) {
  FO_RETURN_IF_CUDA(cudaSetDevice(c.device));
  if (c.peer_to_peer) return CudaStatus(cudaFree(c.workspace), "cudaFree");
  return NcclStatus(ncclMemFree(c.workspace), "ncclMemFree");
}

bool AnyAborted(const std::vector<Communicator*>& comms) {
  return std::any_of(comms.begin(), comms.end(), IsAborted);
}

// The members of every group (group_serial) with an aborted member: those whose NCCL kernels,
// or our waits, may wait for ever for it. A comm_id may hold several groups (one per slice of
// a 2-D mesh); the healthy ones' calls still end.
std::vector<Communicator*> MembersOfAbortedGroups(const std::vector<Communicator*>& comms) {
  std::set<int64_t> broken;
  for (const Communicator* c : comms) {
    if (IsAborted(c)) broken.insert(c->group_serial);
  }
  std::vector<Communicator*> out;
  for (Communicator* c : comms) {
    if (broken.count(c->group_serial) != 0) out.push_back(c);
  }
  return out;
}

// Deregisters and frees every member's workspace once the devices are idle, going on past a
// failure (the first is returned): an aborted communicator took its window along, but its
// buffer is freed all the same; a member whose window could not be deregistered keeps its
// buffer (NCCL may still map it).
Status ReleaseWorkspaces(const std::vector<Communicator*>& comms) {
  Status first = Status::Ok();
  auto keep = [&first](Status s) {
    if (first.ok() && !s.ok()) first = s;
  };
  // Nothing may still use the old buffers. A device with a sticky error (a trapped kernel)
  // fails here and is not waited for; the others still are, and everything is freed.
  for (Communicator* c : comms) {
    Status s = CudaStatus(cudaSetDevice(c->device), "cudaSetDevice");
    if (s.ok()) s = CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    keep(s);
  }
  std::vector<bool> still_registered(comms.size(), false);
  keep(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
  for (size_t i = 0; i < comms.size(); ++i) {
    Communicator* c = comms[i];
    if (c->window == nullptr || c->comm == nullptr || c->aborted.load()) continue;
    Status s = NcclStatus(ncclCommWindowDeregister(c->comm, c->window),
                          "ncclCommWindowDeregister");
    still_registered[i] = !s.ok();
    keep(s);
  }
  keep(NcclStatus(ncclGroupEnd(), "ncclGroupEnd (ncclCommWindowDeregister)"));
  for (size_t i = 0; i < comms.size(); ++i) {
    Communicator* c = comms[i];
    if (still_registered[i]) continue;
    c->window = nullptr;
    if (c->workspace != nullptr) keep(FreeWorkspaceBuffer(*c));
    c->workspace = nullptr;
    c->workspace_bytes = 0;
  }
  return first;
}

// Collectives: ncclMemAlloc + a symmetric window, for all comms together (registration is
// collective over each communicator's group), once every rank has its buffer (AgreeAll).
// Point-to-point: cudaMalloc (communicator.h).
Status AllocateAndRegister(const std::vector<Communicator*>& comms, size_t bytes) {
  Status local = Status::Ok();
  for (Communicator* c : comms) {
    local = CudaStatus(cudaSetDevice(c->device), "cudaSetDevice");
    if (local.ok() && c->peer_to_peer) {
      local = CudaStatus(cudaMalloc(&c->workspace, bytes), "cudaMalloc");
    } else if (local.ok()) {
      local = NcclStatus(ncclMemAlloc(&c->workspace, bytes), "ncclMemAlloc");
    }
    if (!local.ok()) break;
  }
  cudaGetLastError();  // a failed allocation is in `local`; the agreement must not see it
  bool all_ok = false;
  FO_RETURN_IF_NOT_OK(AgreeAll(comms, local.ok(), &all_ok));
  if (!local.ok()) return local;
  if (!all_ok) {
    return Status::Error("another rank of the group could not allocate its " +
                         std::to_string(bytes) + "-byte workspace (its own error names why)");
  }
  if (!std::all_of(comms.begin(), comms.end(), [](Communicator* c) { return c->peer_to_peer; })) {
    FO_RETURN_IF_NCCL(ncclGroupStart());
    for (Communicator* c : comms) {
      if (c->peer_to_peer) continue;
      ncclResult_t res = ncclCommWindowRegister(c->comm, c->workspace, bytes, &c->window,
                                                NCCL_WIN_COLL_SYMMETRIC);
      if (res != ncclSuccess) {
        ncclGroupEnd();  // closes the group only: `res` is the error (DropWorkspaces follows)
        return NcclStatus(res, "ncclCommWindowRegister");
      }
    }
    FO_RETURN_IF_NCCL(ncclGroupEnd());
  }
  for (Communicator* c : comms) c->workspace_bytes = bytes;
  return Status::Ok();
}

// Leaves every member without a workspace after a failure, recording why: a member left with
// one would enqueue NCCL calls that a member without one never joins (a hang); this way every
// local handler refuses alike (UseWorkspace names the error) and the next lowering tries
// again. Buffers with no window are freed (best effort); one NCCL may have registered (a
// registration group that failed part-way) is left to it: deregistering is collective.
Status DropWorkspaces(const std::vector<Communicator*>& comms, Status failure) {
  for (Communicator* c : comms) {
    if (c->workspace != nullptr && c->window == nullptr) FreeWorkspaceBuffer(*c);
    c->workspace = nullptr;
    c->window = nullptr;
    c->workspace_bytes = 0;
    c->workspace_error = failure.message;
  }
  cudaGetLastError();  // what failed above is in `failure`; leave no stale error behind
  return failure;
}

// All or nothing (DropWorkspaces).
Status AllocateWorkspaces(const std::vector<Communicator*>& comms, size_t bytes) {
  Status status = AllocateAndRegister(comms, bytes);
  if (!status.ok()) return DropWorkspaces(comms, status);
  for (Communicator* c : comms) c->workspace_error.clear();
  return status;
}

Status CreateStreamAndEvents(Communicator& c) {
  int least = 0, greatest = 0;
  FO_RETURN_IF_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  FO_RETURN_IF_CUDA(cudaStreamCreateWithPriority(&c.stream, cudaStreamNonBlocking, greatest));
  // The setup agreement's (AgreeAll) before anything that may fail alone on this rank.
  FO_RETURN_IF_CUDA(cudaMalloc(&c.counters, sizeof(int32_t) * kMaxGroups));
  FO_RETURN_IF_CUDA(cudaMemset(c.counters, 0, sizeof(int32_t) * kMaxGroups));
  FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&c.gemm_started, cudaEventDisableTiming));
  FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&c.queue_reset, cudaEventDisableTiming));
  FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&c.comm_done, cudaEventDisableTiming));
  FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&c.sequence_done, cudaEventDisableTiming));
  FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&c.call_done, cudaEventDisableTiming));
  FO_RETURN_IF_CUDA(cudaStreamCreateWithPriority(&c.copy_stream, cudaStreamNonBlocking, greatest));
  FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&c.copies_done, cudaEventDisableTiming));
  for (cudaEvent_t& e : c.group_reduced) {
    FO_RETURN_IF_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  FO_RETURN_IF_CUDA(cudaMalloc(&c.gemm_queue, kGemmQueueBytes));
  // Our kernels that wait for (or signal) another stream's work are loaded now: CUDA's lazy
  // loading would load each at its first launch, a load that waits for the kernels running
  // then. The first call's spin waits then began only after its own GEMM (one H200: group 0
  // ready at 1.90 ms, the GEMM done at 1.86 ms; 0.29 ms in later calls and with
  // CUDA_MODULE_LOADING=EAGER).
  FO_RETURN_IF_CUDA(LoadSpinWaitKernel());
  FO_RETURN_IF_CUDA(LoadWriteFlagKernel());
  FO_RETURN_IF_CUDA(LoadAbortCheckKernel());
  // The GEMM's instances too: a peer-store call's first GEMM launch can come after a wait
  // for its peer (signaling_gemm.h, PrepareSignalingGemms).
  FO_RETURN_IF_CUDA(PrepareSignalingGemms(c.device));
  return Status::Ok();
}

// Frees everything `c` owns but its workspace (ReleaseWorkspaces), going on after a failure
// (the first one is returned); `abort`: ncclCommAbort (local, never waits for peers: error
// paths) instead of ncclCommDestroy.
Status ReleaseOne(Communicator& c, bool abort) {
  Status first = CudaStatus(cudaSetDevice(c.device), "cudaSetDevice");
  auto keep = [&first](Status s) {
    if (first.ok() && !s.ok()) first = s;
  };
  keep(FreeWatchdog(c));
  for (cudaStream_t* s : {&c.stream, &c.copy_stream}) {
    if (*s) keep(CudaStatus(cudaStreamDestroy(*s), "cudaStreamDestroy"));
    *s = nullptr;
  }
  for (cudaEvent_t* e : {&c.gemm_started, &c.queue_reset, &c.comm_done, &c.sequence_done,
                         &c.call_done, &c.copies_done}) {
    if (*e) keep(CudaStatus(cudaEventDestroy(*e), "cudaEventDestroy"));
    *e = nullptr;
  }
  for (cudaEvent_t& e : c.group_reduced) {
    if (e) keep(CudaStatus(cudaEventDestroy(e), "cudaEventDestroy"));
    e = nullptr;
  }
  keep(FreePeerStores(c));
  if (c.counters) keep(CudaStatus(cudaFree(c.counters), "cudaFree"));
  if (c.gemm_queue) keep(CudaStatus(cudaFree(c.gemm_queue), "cudaFree"));
  c.counters = nullptr;
  c.gemm_queue = nullptr;
  if (c.comm && !c.aborted) {  // an aborted one is done with (AbortMembers)
    keep(abort ? NcclStatus(ncclCommAbort(c.comm), "ncclCommAbort")
               : NcclStatus(ncclCommDestroy(c.comm), "ncclCommDestroy"));
  }
  c.comm = nullptr;
  return first;
}

// Destroyed communicators, kept (communicator.h: `destroyed`); small, and made a few times per
// process at most.
std::vector<std::unique_ptr<Communicator>>& Graveyard() {
  static auto* graveyard = new std::vector<std::unique_ptr<Communicator>>();
  return *graveyard;
}

// Creation failed after NCCL's init: nothing of `made` stays behind (best effort).
Status Discard(std::vector<std::unique_ptr<Communicator>>& made, Status failure) {
  for (auto& c : made) {
    if (c->workspace != nullptr) DropWorkspaces({c.get()}, failure);
    ReleaseOne(*c, /*abort=*/true);  // best effort: `failure` is what the caller reports
  }
  cudaGetLastError();  // and no stale error of the cleanup stays behind
  return failure;
}

}  // namespace

Status CreateCommunicators(int64_t comm_id, const ncclUniqueId& id, int world_size,
                           const std::vector<LocalRank>& local, int comm_sms,
                           size_t workspace_bytes, double watchdog_seconds,
                           bool peer_to_peer, int cta_policy) {
  std::lock_guard<std::mutex> admin(AdminMutex());
  if (comm_id == 0) return Status::Error("comm_id must be non-zero");
  if (cta_policy < 0 || cta_policy > 2) {
    return Status::Error("cta_policy must be 0 (default), 1 (efficiency) or 2 (zero), got " +
                         std::to_string(cta_policy));
  }
  if (!(watchdog_seconds >= 0)) return Status::Error("watchdog_seconds must be >= 0");
  if (comm_sms < 0) return Status::Error("comm_sms must be >= 0, got " + std::to_string(comm_sms));
  bool spin_wait = false;  // a typo fails here; ChosenWaitMethod acts on the value below
  FO_RETURN_IF_NOT_OK(ReadWaitEnv(&spin_wait));
  if (local.empty()) return Status::Error("no local ranks given");
  for (size_t i = 0; i < local.size(); ++i) {
    const LocalRank& lr = local[i];
    if (lr.rank < 0 || lr.rank >= world_size) {
      return Status::Error("rank " + std::to_string(lr.rank) + " outside [0, " +
                           std::to_string(world_size) + ")");
    }
    // One member per device and rank: the registry holds one per (comm_id, device), and a
    // second would replace (and free) the first while NCCL still uses it.
    for (size_t j = 0; j < i; ++j) {
      if (local[j].device == lr.device || local[j].rank == lr.rank) {
        return Status::Error("local ranks " + std::to_string(local[j].rank) + " and " +
                             std::to_string(lr.rank) + " repeat a device or rank (device " +
                             std::to_string(lr.device) + ")");
      }
    }
    if (FindCommunicator(comm_id, lr.device) != nullptr) {
      return Status::Error("a communicator for comm_id " + std::to_string(comm_id) +
                           " on device " + std::to_string(lr.device) + " already exists");
    }
  }
  DeviceScope restore_device;
  std::vector<std::unique_ptr<Communicator>> made;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  if (comm_sms > 0) {  // comm_sms == 0: NCCL keeps its own CTA count (nothing left free)
    config.minCTAs = comm_sms;
    config.maxCTAs = comm_sms;
  }
  if (cta_policy != 0) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    config.CTAPolicy = cta_policy;
#else
    return Status::Error("cta_policy needs NCCL >= 2.27 headers at build time");
#endif
  }
  static int64_t groups_created = 0;  // under the admin mutex
  const int64_t group_serial = ++groups_created;
  FO_RETURN_IF_NCCL(ncclGroupStart());
  for (const LocalRank& lr : local) {
    auto c = std::make_unique<Communicator>();
    c->comm_id = comm_id;
    c->group_serial = group_serial;
    c->device = lr.device;
    c->rank = lr.rank;
    c->world_size = world_size;
    c->comm_sms = comm_sms;
    c->cta_policy = cta_policy;
    c->peer_to_peer = peer_to_peer;
    cudaError_t err = cudaSetDevice(lr.device);
    ncclResult_t res = err == cudaSuccess
                           ? ncclCommInitRankConfig(&c->comm, world_size, id, lr.rank, &config)
                           : ncclInvalidArgument;
    made.push_back(std::move(c));
    if (res != ncclSuccess) {
      ncclGroupEnd();  // closes the group only: `err` / `res` is the error reported
      return Discard(made, err != cudaSuccess ? CudaStatus(err, "cudaSetDevice")
                                              : NcclStatus(res, "ncclCommInitRankConfig"));
    }
  }
  Status status = NcclStatus(ncclGroupEnd(), "ncclGroupEnd (ncclCommInitRankConfig)");
  if (!status.ok()) return Discard(made, status);
  std::vector<Communicator*> members;
  for (auto& c : made) {  // every member tries (the agreement below needs each one's stream)
    Status step = CudaStatus(cudaSetDevice(c->device), "cudaSetDevice");
    if (step.ok()) step = CreateStreamAndEvents(*c);
    c->watchdog_seconds = watchdog_seconds;
    if (step.ok()) step = InitWatchdog(*c);
    // The watchdog's abort flag is read by the spin kernel (a stream wait cannot be aborted).
    c->wait_method = watchdog_seconds > 0 ? WaitMethod::kSpinKernel : ChosenWaitMethod(c->device);
    c->write_method = ChosenWriteMethod();
    members.push_back(c.get());
    if (status.ok()) status = step;
  }
  // Every rank of the group (other processes too) says whether its setup went through before
  // any keeps its communicators: one that failed here alone would otherwise abort its own and
  // leave the others in the workspace's agreement. Only impossible without a stream and
  // counters (then the others wait kAgreeWaitSeconds for it, and abort).
  const bool can_agree = std::all_of(members.begin(), members.end(), [](const Communicator* c) {
    return c->stream != nullptr && c->counters != nullptr;
  });
  if (can_agree) {
    cudaGetLastError();  // a failed step is in `status`; the agreement must not see it
    bool all_ok = false;
    Status agreed = AgreeAll(members, status.ok(), &all_ok);
    if (status.ok() && !agreed.ok()) status = agreed;
    if (status.ok() && !all_ok) {
      status = Status::Error("another rank of the group could not set up its communicator (its "
                             "own error names why)");
    }
  }
  if (!status.ok()) return Discard(made, status);
  // A failed workspace keeps the communicators (valid, without a workspace: their handlers
  // refuse, naming the error); EnsureWorkspace may retry it. jax_flashoverlap.comm destroys
  // them instead, so that a comm_id's groups are all made or none (its next lowering).
  if (workspace_bytes > 0) status = AllocateWorkspaces(members, RoundGrowth(workspace_bytes));
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (auto& c : made) {
    int device = c->device;
    Registry()[{comm_id, device}] = std::move(c);
  }
  return status;
}

Status EnsureWorkspace(int64_t comm_id, size_t bytes) {
  auto needed = [bytes](const std::vector<Communicator*>& comms) {
    return !std::all_of(comms.begin(), comms.end(),
                        [bytes](const Communicator* c) { return c->workspace_bytes >= bytes; });
  };
  // Quiesced (no call in flight), the device synchronization in ReleaseWorkspaces waits only
  // for work that can finish.
  return GrowMemberBuffers(comm_id, "growing the workspace", needed,
                           [bytes](const std::vector<Communicator*>& comms) {
    Status released = ReleaseWorkspaces(comms);
    if (released.ok() && AnyAborted(comms)) {
      released = Status::Error("a communicator of this group was aborted by the watchdog; "
                               "restart the process");
    }
    if (!released.ok()) {
      // The other ranks go on to agree on their new buffers (AllocateWorkspaces): say no
      // rather than leave them waiting (an aborted member cannot take part; they then wait
      // kAgreeWaitSeconds and abort theirs).
      if (!AnyAborted(comms)) {
        bool all_ok = false;
        Status said = AgreeAll(comms, /*local_ok=*/false, &all_ok);
        if (!said.ok()) released.message += "; then " + said.message;
      }
      return DropWorkspaces(comms, released);
    }
    return AllocateWorkspaces(comms, RoundGrowth(bytes));
  });
}

Status GrowMemberBuffers(int64_t comm_id, const char* what,
                         const std::function<bool(const std::vector<Communicator*>&)>& needed,
                         const MemberBufferStep& grow) {
  std::lock_guard<std::mutex> admin(AdminMutex());
  std::vector<Communicator*> comms = LocalMembers(comm_id);
  if (comms.empty()) return Status::Error("no communicator with comm_id " + std::to_string(comm_id));
  if (!needed(comms)) return Status::Ok();
  // No call in flight and none starting until the new buffers are in place (quiesce.h).
  CallLocks calls;
  Status quiet = QuiesceMembers(comms, kGrowWaitSeconds, &calls);
  if (!quiet.ok()) {
    return Status::Error(std::string(what) + " of comm_id " + std::to_string(comm_id) + ": " +
                         quiet.message);
  }
  DeviceScope restore_device;
  return grow(comms);
}

Status WithLocalMembers(int64_t comm_id, const MemberBufferStep& step) {
  std::lock_guard<std::mutex> admin(AdminMutex());
  std::vector<Communicator*> comms = LocalMembers(comm_id);
  if (comms.empty()) return Status::Error("no communicator with comm_id " + std::to_string(comm_id));
  DeviceScope restore_device;
  return step(comms);
}

Status ConnectPeers(int64_t comm_id) {
  return ConnectPeers(comm_id, kAgreeWaitSeconds, kAbortGraceSeconds);
}

Status ConnectPeers(int64_t comm_id, double wait_seconds, double abort_grace_seconds) {
  // As a growth: every member's call mutex, no call in flight. A compiled program still
  // running on another thread (one that found these members after a destroy and a new
  // lowering made them again) would otherwise send on the same communicators and streams as
  // the handshake, from two threads at once. Unconnected members an earlier handshake (or the
  // watchdog) aborted are refused (NCCL freed them), asked under the admin mutex before the
  // quiesce, which would refuse them naming the watchdog only.
  bool refuse_aborted = false;
  auto unconnected = [&refuse_aborted](const std::vector<Communicator*>& comms) {
    const bool needed =
        !std::all_of(comms.begin(), comms.end(), [](Communicator* c) { return c->p2p_connected; });
    refuse_aborted = needed && AnyAborted(comms);
    return needed && !refuse_aborted;
  };
  auto connect = [comm_id, wait_seconds, abort_grace_seconds](const std::vector<Communicator*>& comms) {
    for (Communicator* c : comms) {
      if (!c->peer_to_peer) {
        return Status::Error("ConnectPeers: comm_id " + std::to_string(comm_id) +
                             " was created for collectives, not point-to-point");
      }
      if (c->workspace == nullptr || c->workspace_bytes < 2 * sizeof(int32_t) * c->world_size) {
        return Status::Error("ConnectPeers needs the workspace allocated first");
      }
    }
    FO_RETURN_IF_NOT_OK(RunBoundedSetupGroup(
        comms,
        [](Communicator& c) {
          int32_t* buf = static_cast<int32_t*>(c.workspace);
          for (int peer = 0; peer < c.world_size; ++peer) {
            if (peer == c.rank) continue;
            ncclResult_t res = ncclSend(buf + peer, 1, ncclInt32, peer, c.comm, c.stream);
            if (res == ncclSuccess) {
              res = ncclRecv(buf + c.world_size + peer, 1, ncclInt32, peer, c.comm, c.stream);
            }
            if (res != ncclSuccess) return NcclStatus(res, "ncclSend/ncclRecv");
          }
          return Status::Ok();
        },
        "peer connection", wait_seconds, abort_grace_seconds));
    for (Communicator* c : comms) c->p2p_connected = true;
    return Status::Ok();
  };
  Status status = GrowMemberBuffers(comm_id, "connecting the peers", unconnected, connect);
  if (status.ok() && refuse_aborted) {
    return Status::Error("ConnectPeers: the communicators of comm_id " + std::to_string(comm_id) +
                         " were aborted (an earlier setup step or call failed); restart the process");
  }
  return status;
}

Communicator* FindCommunicator(int64_t comm_id, int device) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find({comm_id, device});
  return it == Registry().end() ? nullptr : it->second.get();
}

bool HasCommunicators(int64_t comm_id) { return !LocalMembers(comm_id).empty(); }

Status DestroyCommunicators(int64_t comm_id) {
  std::lock_guard<std::mutex> admin(AdminMutex());
  std::vector<Communicator*> comms = LocalMembers(comm_id);
  if (comms.empty()) return Status::Ok();
  // No call in flight and none starting while what calls use is freed (quiesce.h). After a
  // watchdog abort calls may never drain; NCCL's kernels were let go, so the device
  // synchronization in ReleaseWorkspaces ends: only the mutexes are needed then.
  CallLocks calls;
  Status quiet = QuiesceMembers(comms, kDestroyWaitSeconds, &calls);
  if (!quiet.ok() && !AnyAborted(comms)) {
    return Status::Error("destroying the communicators of comm_id " + std::to_string(comm_id) +
                         ": " + quiet.message);
  }
  Status aborted = Status::Ok();
  if (!quiet.ok()) {
    calls = LockMembers(comms);
    // A member the watchdog aborted leaves the others of its group (this process's included)
    // with NCCL kernels, or our waits, that may never end: the device synchronization and
    // frees below would wait for them for ever. Abort those groups' members first (bounded:
    // an abort that waits for ever for such a kernel ends the process instead).
    aborted = AbortMembersOrExit(MembersOfAbortedGroups(comms),
                                 "destroying the communicators of comm_id " +
                                     std::to_string(comm_id) + " after a watchdog abort");
  }
  {
    // Out of the registry first (FindCommunicator: none), kept alive in the graveyard.
    std::lock_guard<std::mutex> lock(RegistryMutex());
    for (auto it = Registry().begin(); it != Registry().end();) {
      if (comm_id == 0 || it->first.first == comm_id) {
        Graveyard().push_back(std::move(it->second));
        it = Registry().erase(it);
      } else {
        it = std::next(it);
      }
    }
  }
  for (Communicator* c : comms) c->destroyed = true;  // handlers that found one refuse
  DeviceScope restore_device;
  Status first_error = aborted;
  Status released = ReleaseWorkspaces(comms);
  if (first_error.ok()) first_error = released;
  for (Communicator* c : comms) {
    Status s = ReleaseOne(*c, /*abort=*/false);
    if (first_error.ok() && !s.ok()) first_error = s;
  }
  return first_error;
}

std::vector<CommunicatorSummary> ListCommunicators() {
  std::lock_guard<std::mutex> admin(AdminMutex());
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<CommunicatorSummary> out;
  for (auto& [key, c] : Registry()) {
    // Spanning processes: buffers, and no local member object for another rank.
    bool across = false;
    for (int i = 0; i < c->world_size && i < kMaxPeerRanks; ++i) {
      if (i != c->rank && c->peer_members[i] == nullptr && c->peer.buffers.recv != nullptr) across = true;
    }
    out.push_back({c->comm_id, c->device, c->rank, c->world_size, c->comm_sms,
                   c->workspace_bytes,
                   c->wait_method == WaitMethod::kStreamOp ? "stream_op" : "spin",
                   c->write_method == WriteMethod::kStreamOp ? "stream_op" : "kernel",
                   c->watchdog_seconds, c->aborted.load(), c->peer_to_peer, c->cta_policy,
                   c->workspace_error, c->peer_recv_bytes, c->peer_broken.load(),
                   across, c->peer.buffers.mirror_staged, c->peer_grant_results.load(),
                   c->peer_connected});
  }
  return out;
}

}  // namespace flashoverlap
