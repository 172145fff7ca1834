#include "xla_ffi/comm/peer_stores.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "xla_ffi/comm/peer_reduce_args.h"

namespace flashoverlap {
namespace {

std::string Dev(int device) { return "device " + std::to_string(device); }

// Every rank of a world of 2 to kMaxPeerRanks, all here, each on its own device; or one rank
// of such a group whose other ranks are in other processes (`*spanning`: one GPU per process,
// peer_ipc.h); or, `loopback`, the one rank of a world of one (peer_stores.h).
Status CheckGroup(const std::vector<Communicator*>& comms, bool loopback, bool* spanning) {
  *spanning = false;
  if (loopback) {
    if (comms.size() != 1 || comms[0]->world_size != 1) {
      return Status::Error("peer-store loopback needs a communicator of 1 rank; this process "
                           "holds " + std::to_string(comms.size()) + " of a group of " +
                           std::to_string(comms[0]->world_size));
    }
    return Status::Ok();
  }
  const int world = comms[0]->world_size;
  if (world < 2 || world > kMaxPeerRanks) {
    return Status::Error("peer stores need a group of 2 to " + std::to_string(kMaxPeerRanks) +
                         " ranks (all in this process, or one per process); this process holds " +
                         std::to_string(comms.size()) +
                         " of a group of " + std::to_string(world));
  }
  if (comms.size() == 1) {
    *spanning = true;
    return Status::Ok();
  }
  if (static_cast<int>(comms.size()) != world) {
    return Status::Error("peer stores need every rank of a group in this process, or one rank per "
                         "process; this process holds " + std::to_string(comms.size()) +
                         " of a group of " + std::to_string(world));
  }
  for (size_t i = 0; i < comms.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (comms[i]->device == comms[j]->device) {
        return Status::Error("peer stores need every rank on its own device; ranks " + std::to_string(j) +
                             " and " + std::to_string(i) + " are both on " + Dev(comms[i]->device));
      }
    }
  }
  return Status::Ok();
}

// Whether `device` has native atomics on `peer`'s memory: the GEMM counts a group's tiles
// with atomics in the other GPU's memory (NVLink gives them; PCIe peer-to-peer does not, and
// counts would be lost: the other rank would wait for ever).
Status CheckPeerAtomics(int device, int peer, const std::string& peer_name) {
  int atomics = 0;
  FO_RETURN_IF_CUDA(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer));
  if (atomics != 1) {
    return Status::Error(Dev(device) + " has no native atomics on the memory of " + peer_name +
                         " (cudaDevP2PAttrNativeAtomicSupported): peer stores count tiles with "
                         "atomics in the other GPU's memory, which needs NVLink; use "
                         "JAX_FLASHOVERLAP_TRANSPORT=nccl");
  }
  return Status::Ok();
}

// `c`'s device may load from and store to every other member's memory (once per member).
Status EnablePeerAccess(Communicator& c, const std::vector<Communicator*>& comms) {
  if (c.peer_access) return Status::Ok();
  FO_RETURN_IF_CUDA(cudaSetDevice(c.device));
  for (const Communicator* other : comms) {
    if (other == &c) continue;
    int can = 0;
    FO_RETURN_IF_CUDA(cudaDeviceCanAccessPeer(&can, c.device, other->device));
    if (!can) {
      return Status::Error(Dev(c.device) + " cannot access the memory of " + Dev(other->device) +
                           " (cudaDeviceCanAccessPeer): peer stores need peer access (NVLink) "
                           "between every two ranks of the group");
    }
    FO_RETURN_IF_NOT_OK(CheckPeerAtomics(c.device, other->device, Dev(other->device)));
    const cudaError_t e = cudaDeviceEnablePeerAccess(other->device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // enabled before (by XLA or the user): what we need
    } else {
      FO_RETURN_IF_CUDA(e);
    }
  }
  c.peer_access = true;
  return Status::Ok();
}

// A recv buffer of `bytes`, filled with NaN bytes (a partial read before it arrived shows),
// and, once, the signal words, zeroed.
Status Allocate(Communicator& c, size_t bytes) {
  FO_RETURN_IF_CUDA(cudaSetDevice(c.device));
  void* recv = nullptr;
  FO_RETURN_IF_CUDA(cudaMalloc(&recv, bytes));
  c.peer.buffers.recv = recv;
  c.peer_recv_bytes = bytes;
  ++c.peer_generation;
  FO_RETURN_IF_CUDA(cudaMemset(recv, 0xFF, bytes));
  if (c.peer.buffers.signals == nullptr) {
    // Kept only once zeroed: they are allocated once and never zeroed again (they count calls).
    int32_t* signals = nullptr;
    FO_RETURN_IF_CUDA(cudaMalloc(&signals, sizeof(int32_t) * kPeerSignalWords));
    const cudaError_t zeroed = cudaMemset(signals, 0, sizeof(int32_t) * kPeerSignalWords);
    if (zeroed != cudaSuccess) {
      cudaFree(signals);  // best effort: `zeroed` is the error reported
      return CudaStatus(zeroed, "cudaMemset (peer-store signals)");
    }
    c.peer.buffers.signals = signals;
  }
  FO_RETURN_IF_CUDA(cudaDeviceSynchronize());
  return Status::Ok();
}

Status FreeRecv(Communicator& c) {
  Status s = Status::Ok();
  if (c.peer.buffers.recv != nullptr) {
    s = CudaStatus(cudaFree(const_cast<void*>(c.peer.buffers.recv)), "cudaFree (peer-store recv)");
  }
  c.peer.buffers.recv = nullptr;
  c.peer_recv_bytes = 0;
  // Nor does it point at its peers' current buffers any more: until a growth or an import
  // connects it again, a call is refused (CheckPeerStores) instead of run and then breaking
  // the group (after a failed growth no program with the call ran anywhere).
  c.peer_connected = false;
  return s;
}

// One group's members (ordered by rank; loopback: its one member, its own peer): their
// buffers swapped for new ones of `bytes`.
Status GrowGroup(const std::vector<Communicator*>& comms, size_t bytes, bool loopback, bool stage_mirrors) {
  bool spanning = false;
  FO_RETURN_IF_NOT_OK(CheckGroup(comms, loopback, &spanning));
  for (const Communicator* c : comms) {
    if (c->peer_broken) {
      return Status::Error("an earlier peer-store call of this group failed; restart the process");
    }
    if (c->aborted) {
      return Status::Error("a communicator of this group was aborted by the watchdog; restart the process");
    }
  }
  if (!loopback && !spanning) {
    for (Communicator* c : comms) FO_RETURN_IF_NOT_OK(EnablePeerAccess(*c, comms));
  }
  if (spanning) {  // the others replace theirs now too: this process must hold none of them
    for (int i = 0; i < kMaxPeerRanks; ++i) {
      if (comms[0]->peer_mapped.recv[i] != nullptr) {
        return Status::Error("growing the buffers of a group spanning processes while this process "
                             "still maps rank " + std::to_string(i) + "'s: ReleasePeerStores on "
                             "every process first, then a barrier (peer_stores.h)");
      }
    }
  }
  Status status = Status::Ok();
  for (Communicator* c : comms) {
    // No call in flight (GrowMemberBuffers): the old buffer is read by nothing.
    Status freed = CudaStatus(cudaSetDevice(c->device), "cudaSetDevice");
    if (freed.ok()) freed = FreeRecv(*c);
    if (status.ok()) status = freed;
    if (status.ok()) status = Allocate(*c, bytes);
  }
  if (!status.ok()) {  // all or nothing: no member keeps a buffer another lacks
    for (Communicator* c : comms) {  // best effort: `status` is the error reported
      cudaSetDevice(c->device);
      FreeRecv(*c);  // drops the buffer's pointer whatever cudaFree says; not connected
    }
    cudaGetLastError();  // no stale error of the cleanup stays behind
    return status;
  }
  if (spanning) {  // the other ranks' buffers come with ImportPeerStores
    Communicator& me = *comms[0];
    me.peer.buffers.rank = me.rank;
    me.peer.buffers.world = me.world_size;
    me.peer.buffers.mirror_staged = true;  // the others' results live in their processes
    return Status::Ok();  // not connected (FreeRecv) until ImportPeerStores
  }
  // Loopback: a group of 2 whose rank 1 is rank 0 itself (its stores land in its own buffers).
  const int world = loopback ? 2 : static_cast<int>(comms.size());
  for (Communicator* me : comms) {
    PeerReduceBuffers& b = me->peer.buffers;
    b.rank = me->rank;
    b.world = world;
    b.mirror_staged = stage_mirrors;
    for (int i = 0; i < world; ++i) {
      Communicator* member = comms[loopback ? 0 : i];
      b.peers_recv[i] = const_cast<void*>(member->peer.buffers.recv);
      b.peers_signals[i] = member->peer.buffers.signals;
      me->peer_members[i] = member;
    }
    me->peer.wait_method = me->wait_method;
    me->peer.write_method = me->write_method;
    me->peer.abort_flag = me->abort_flag;
    me->peer_connected = true;
  }
  return Status::Ok();
}

// comm_id's local members by group (group_serial), each ordered by rank.
std::map<int64_t, std::vector<Communicator*>> ByGroup(const std::vector<Communicator*>& comms) {
  std::map<int64_t, std::vector<Communicator*>> groups;
  for (Communicator* c : comms) groups[c->group_serial].push_back(c);
  for (auto& [serial, members] : groups) {
    std::sort(members.begin(), members.end(),
              [](const Communicator* a, const Communicator* b) { return a->rank < b->rank; });
  }
  return groups;
}

Status Ensure(int64_t comm_id, size_t recv_bytes, bool loopback, bool stage_mirrors) {
  // A member needs new buffers if it has none, too few bytes, or the other staging setting
  // (a group spanning processes, one member here, always stages).
  auto needed = [recv_bytes, loopback, stage_mirrors](const std::vector<Communicator*>& comms) {
    for (auto& [serial, members] : ByGroup(comms)) {
      const bool spanning = !loopback && members.size() == 1;
      for (const Communicator* c : members) {
        if (c->peer.buffers.recv == nullptr || c->peer_recv_bytes < recv_bytes ||
            c->peer.buffers.mirror_staged != (spanning || stage_mirrors))
          return true;
      }
    }
    return false;
  };
  Status status = GrowMemberBuffers(
      comm_id, "allocating peer-store buffers", needed,
      [recv_bytes, loopback, stage_mirrors](const std::vector<Communicator*>& comms) {
        for (auto& [serial, members] : ByGroup(comms)) {
          FO_RETURN_IF_NOT_OK(GrowGroup(members, RoundGrowth(recv_bytes > 0 ? recv_bytes : 1), loopback,
                                        stage_mirrors));
        }
        return Status::Ok();
      });
  if (!status.ok()) status.message = "peer stores (comm_id " + std::to_string(comm_id) + "): " + status.message;
  return status;
}

// Rank `rank`'s record for member `c` (its group's size `world`), parsed and checked against
// c's own: the same size of recv (the processes lowered the same programs), another process.
Status ParseMemberRecord(const Communicator& c, const std::vector<std::string>& records, int rank,
                         PeerRecord* r) {
  const std::string who = "rank " + std::to_string(rank) + " of the group of " + Dev(c.device) +
                          " (rank " + std::to_string(c.rank) + ")";
  Status parsed = ParsePeerRecord(records[rank], r);
  if (!parsed.ok()) return Status::Error(who + ": " + parsed.message);
  if (rank == c.rank) {
    if (!MadeHere(*r) || r->generation != c.peer_generation) {
      return Status::Error(who + ": the record given for this rank is not its current one "
                           "(generation " + std::to_string(r->generation) + ", current " +
                           std::to_string(c.peer_generation) + ")");
    }
    return Status::Ok();
  }
  if (r->recv_bytes != c.peer_recv_bytes) {
    return Status::Error(who + " has a peer-store buffer of " + std::to_string(r->recv_bytes) +
                         " bytes, this rank " + std::to_string(c.peer_recv_bytes) +
                         ": every process must lower the same programs in the same order");
  }
  return Status::Ok();
}

// CheckPeerAtomics for a rank of another process, where this process sees its GPU (found by
// UUID; a process shown only its own GPU, CUDA_VISIBLE_DEVICES, cannot ask and goes on).
Status CheckPeerAtomicsByUuid(int device, const uint8_t uuid[16]) {
  int count = 0;
  FO_RETURN_IF_CUDA(cudaGetDeviceCount(&count));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    FO_RETURN_IF_CUDA(cudaGetDeviceProperties(&prop, d));
    if (d != device && std::memcmp(&prop.uuid, uuid, 16) == 0) {
      return CheckPeerAtomics(device, d, "GPU " + UuidText(uuid) + " (another process's rank)");
    }
  }
  return Status::Ok();
}

// Member `c` (a group spanning processes) to the other ranks' current buffers.
Status ConnectMember(Communicator& c, const std::vector<std::string>& records) {
  const int world = c.world_size;
  if (static_cast<int>(records.size()) != world) {
    return Status::Error(Dev(c.device) + ": " + std::to_string(records.size()) +
                         " peer-store records for a group of " + std::to_string(world));
  }
  if (c.peer.buffers.recv == nullptr) {
    return Status::Error(Dev(c.device) + " has no peer-store buffer to connect (EnsurePeerStores first)");
  }
  std::vector<PeerRecord> parsed(world);
  for (int i = 0; i < world; ++i) {
    FO_RETURN_IF_NOT_OK(ParseMemberRecord(c, records, i, &parsed[i]));
    for (int j = 0; j < i; ++j) {
      if (std::memcmp(parsed[i].device_uuid, parsed[j].device_uuid, 16) == 0) {
        return Status::Error("peer stores need every rank on its own GPU; ranks " + std::to_string(j) +
                             " and " + std::to_string(i) + " are both on " + UuidText(parsed[i].device_uuid));
      }
    }
    if (i != c.rank) FO_RETURN_IF_NOT_OK(CheckPeerAtomicsByUuid(c.device, parsed[i].device_uuid));
  }
  c.peer_connected = false;  // until every pointer below is the current one
  FO_RETURN_IF_CUDA(cudaSetDevice(c.device));
  PeerReduceBuffers& b = c.peer.buffers;
  for (int i = 0; i < world; ++i) {
    if (i == c.rank) {
      b.peers_recv[i] = const_cast<void*>(b.recv);
      b.peers_signals[i] = b.signals;
      c.peer_members[i] = &c;
      continue;
    }
    FO_RETURN_IF_NOT_OK(OpenPeerRecord(parsed[i], i, &c.peer_mapped));
    b.peers_recv[i] = c.peer_mapped.recv[i];
    b.peers_signals[i] = c.peer_mapped.signals[i];
    c.peer_members[i] = nullptr;  // in another process: told by its kPeerFailed word only
  }
  b.rank = c.rank;
  b.world = world;
  c.peer.wait_method = c.wait_method;
  c.peer.write_method = c.write_method;
  c.peer.abort_flag = c.abort_flag;
  c.peer_connected = true;
  return Status::Ok();
}

}  // namespace

Status EnsurePeerStores(int64_t comm_id, size_t recv_bytes, bool stage_mirrors, bool grant_results) {
  FO_RETURN_IF_NOT_OK(Ensure(comm_id, recv_bytes, /*loopback=*/false, stage_mirrors));
  // Read by calls without a lock (atomic): only the next result asked about sees the change.
  return WithLocalMembers(comm_id, [grant_results](const std::vector<Communicator*>& comms) {
    for (Communicator* c : comms) c->peer_grant_results = grant_results;
    return Status::Ok();
  });
}

Status EnsurePeerStoresLoopback(int64_t comm_id, size_t recv_bytes, bool stage_mirrors) {
  return Ensure(comm_id, recv_bytes, /*loopback=*/true, stage_mirrors);
}

Status ExportPeerStores(int64_t comm_id, std::vector<PeerStoresRecord>* records) {
  records->clear();
  return WithLocalMembers(comm_id, [records](const std::vector<Communicator*>& comms) {
    for (const Communicator* c : comms) {
      if (c->peer.buffers.recv == nullptr) {
        return Status::Error(Dev(c->device) + " has no peer-store buffer (EnsurePeerStores first)");
      }
      PeerStoresRecord r{c->device, c->rank, {}};
      FO_RETURN_IF_NOT_OK(MakePeerRecord(c->device, c->peer.buffers.recv, c->peer_recv_bytes,
                                         c->peer.buffers.signals, c->peer_generation, &r.bytes));
      records->push_back(std::move(r));
    }
    return Status::Ok();
  });
}

Status ReleasePeerStores(int64_t comm_id, size_t recv_bytes) {
  auto will_grow = [recv_bytes](const Communicator* c) {
    return c->peer.buffers.mirror_staged && c->peer.buffers.recv != nullptr && c->peer_recv_bytes < recv_bytes;
  };
  Status status = GrowMemberBuffers(
      comm_id, "closing the other processes' peer-store buffers before a growth",
      [will_grow](const std::vector<Communicator*>& comms) {
        return std::any_of(comms.begin(), comms.end(), will_grow);
      },
      [will_grow](const std::vector<Communicator*>& comms) {
        Status first = Status::Ok();
        for (Communicator* c : comms) {
          if (!will_grow(c)) continue;
          c->peer_connected = false;
          Status s = CudaStatus(cudaSetDevice(c->device), "cudaSetDevice");
          if (s.ok()) s = ClosePeerMappings(&c->peer_mapped, /*keep_signals=*/true);
          if (first.ok()) first = s;
        }
        return first;
      });
  if (!status.ok()) status.message = "peer stores (comm_id " + std::to_string(comm_id) + "): " + status.message;
  return status;
}

Status ImportPeerStores(int64_t comm_id, const std::map<int, std::vector<std::string>>& by_device) {
  // Nothing to do when every member already points at the generations these records name.
  auto needed = [&by_device](const std::vector<Communicator*>& comms) {
    for (const Communicator* c : comms) {
      auto found = by_device.find(c->device);
      if (!c->peer_connected || found == by_device.end()) return true;
      for (size_t i = 0; i < found->second.size(); ++i) {
        PeerRecord r;
        if (static_cast<int>(i) == c->rank) continue;
        if (!ParsePeerRecord(found->second[i], &r).ok() || i >= static_cast<size_t>(kMaxPeerRanks) ||
            r.generation != c->peer_mapped.generation[i]) {
          return true;
        }
      }
    }
    return false;
  };
  Status status = GrowMemberBuffers(
      comm_id, "opening the other processes' peer-store buffers", needed,
      [&by_device](const std::vector<Communicator*>& comms) {
        for (Communicator* c : comms) {
          auto found = by_device.find(c->device);
          if (found == by_device.end()) {
            return Status::Error("no peer-store records for " + Dev(c->device));
          }
          if (c->peer_broken) {
            return Status::Error("an earlier peer-store call of this group failed; restart the process");
          }
          FO_RETURN_IF_NOT_OK(ConnectMember(*c, found->second));
        }
        return Status::Ok();
      });
  if (!status.ok()) status.message = "peer stores (comm_id " + std::to_string(comm_id) + "): " + status.message;
  return status;
}

void MarkPeerStoresBroken(Communicator& c) {
  c.peer_broken = true;
  for (Communicator* member : c.peer_members) {
    if (member != nullptr) member->peer_broken = true;
  }
}

Status FreePeerStores(Communicator& c) {
  Status status = ClosePeerMappings(&c.peer_mapped);  // the others' first: ours may go after
  Status freed = FreeRecv(c);  // and no longer connected
  if (status.ok()) status = freed;
  if (c.peer.buffers.signals != nullptr) {
    Status s = CudaStatus(cudaFree(c.peer.buffers.signals), "cudaFree (peer-store signals)");
    if (status.ok()) status = s;
  }
  c.peer.buffers = PeerReduceBuffers{};
  return status;
}

}  // namespace flashoverlap
