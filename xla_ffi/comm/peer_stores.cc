#include "xla_ffi/comm/peer_stores.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "xla_ffi/comm/peer_reduce_args.h"

namespace flashoverlap {
namespace {

std::string Dev(int device) { return "device " + std::to_string(device); }

// Every rank of a world of 2 to kMaxPeerRanks, all here, each on its own device; or,
// `loopback`, the one rank of a world of one (peer_stores.h).
Status CheckGroup(const std::vector<Communicator*>& comms, bool loopback) {
  if (loopback) {
    if (comms.size() != 1 || comms[0]->world_size != 1) {
      return Status::Error("peer-store loopback needs a communicator of 1 rank; this process "
                           "holds " + std::to_string(comms.size()) + " of a group of " +
                           std::to_string(comms[0]->world_size));
    }
    return Status::Ok();
  }
  const int world = comms[0]->world_size;
  if (world < 2 || world > kMaxPeerRanks || static_cast<int>(comms.size()) != world) {
    return Status::Error("peer stores need a group of 2 to " + std::to_string(kMaxPeerRanks) +
                         " ranks with every device in this process; this process holds " +
                         std::to_string(comms.size()) + " of a group of " + std::to_string(world));
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
                           " (cudaDeviceCanAccessPeer): peer stores need peer access (NVLink or "
                           "PCIe peer-to-peer) between every two ranks of the group");
    }
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
  FO_RETURN_IF_CUDA(cudaMemset(recv, 0xFF, bytes));
  if (c.peer.buffers.signals == nullptr) {
    int32_t* signals = nullptr;
    FO_RETURN_IF_CUDA(cudaMalloc(&signals, sizeof(int32_t) * kPeerSignalWords));
    c.peer.buffers.signals = signals;
    FO_RETURN_IF_CUDA(cudaMemset(signals, 0, sizeof(int32_t) * kPeerSignalWords));
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
  return s;
}

// One group's members (ordered by rank; loopback: its one member, its own peer): their
// buffers swapped for new ones of `bytes`.
Status GrowGroup(const std::vector<Communicator*>& comms, size_t bytes, bool loopback) {
  FO_RETURN_IF_NOT_OK(CheckGroup(comms, loopback));
  for (const Communicator* c : comms) {
    if (c->peer_broken) {
      return Status::Error("an earlier peer-store call of this group failed; restart the process");
    }
    if (c->aborted) {
      return Status::Error("a communicator of this group was aborted by the watchdog; restart the process");
    }
  }
  if (!loopback) {
    for (Communicator* c : comms) FO_RETURN_IF_NOT_OK(EnablePeerAccess(*c, comms));
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
    for (Communicator* c : comms) {
      cudaSetDevice(c->device);
      FreeRecv(*c);
    }
    return status;
  }
  // Loopback: a group of 2 whose rank 1 is rank 0 itself (its stores land in its own buffers).
  const int world = loopback ? 2 : static_cast<int>(comms.size());
  for (Communicator* me : comms) {
    PeerReduceBuffers& b = me->peer.buffers;
    b.rank = me->rank;
    b.world = world;
    for (int i = 0; i < world; ++i) {
      Communicator* member = comms[loopback ? 0 : i];
      b.peers_recv[i] = const_cast<void*>(member->peer.buffers.recv);
      b.peers_signals[i] = member->peer.buffers.signals;
      me->peer_members[i] = member;
    }
    me->peer.wait_method = me->wait_method;
    me->peer.abort_flag = me->abort_flag;
  }
  return Status::Ok();
}

// Every group's members (those of comm_id split by group, each ordered by rank).
Status Grow(const std::vector<Communicator*>& comms, size_t bytes, bool loopback) {
  std::map<int64_t, std::vector<Communicator*>> groups;
  for (Communicator* c : comms) groups[c->group_serial].push_back(c);
  for (auto& [serial, members] : groups) {
    std::sort(members.begin(), members.end(),
              [](const Communicator* a, const Communicator* b) { return a->rank < b->rank; });
    FO_RETURN_IF_NOT_OK(GrowGroup(members, bytes, loopback));
  }
  return Status::Ok();
}

Status Ensure(int64_t comm_id, size_t recv_bytes, bool loopback) {
  auto needed = [recv_bytes](const std::vector<Communicator*>& comms) {
    for (const Communicator* c : comms) {
      if (c->peer.buffers.recv == nullptr || c->peer_recv_bytes < recv_bytes) return true;
    }
    return false;
  };
  Status status = GrowMemberBuffers(
      comm_id, "allocating peer-store buffers", needed,
      [recv_bytes, loopback](const std::vector<Communicator*>& comms) {
        return Grow(comms, RoundGrowth(recv_bytes > 0 ? recv_bytes : 1), loopback);
      });
  if (!status.ok()) status.message = "peer stores (comm_id " + std::to_string(comm_id) + "): " + status.message;
  return status;
}

}  // namespace

Status EnsurePeerStores(int64_t comm_id, size_t recv_bytes) {
  return Ensure(comm_id, recv_bytes, /*loopback=*/false);
}

Status EnsurePeerStoresLoopback(int64_t comm_id, size_t recv_bytes) {
  return Ensure(comm_id, recv_bytes, /*loopback=*/true);
}

void MarkPeerStoresBroken(Communicator& c) {
  c.peer_broken = true;
  for (Communicator* member : c.peer_members) {
    if (member != nullptr) member->peer_broken = true;
  }
}

Status FreePeerStores(Communicator& c) {
  Status status = FreeRecv(c);
  if (c.peer.buffers.signals != nullptr) {
    Status s = CudaStatus(cudaFree(c.peer.buffers.signals), "cudaFree (peer-store signals)");
    if (status.ok()) status = s;
  }
  c.peer.buffers = PeerReduceBuffers{};
  return status;
}

}  // namespace flashoverlap
