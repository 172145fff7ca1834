// pybind11 module jax_flashoverlap._xla_ffi: the FFI handler capsules to register with XLA,
// build information, and (xla_ffi/comm) communicator setup. No computation happens here.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/peer_access.h"
#include "xla_ffi/comm/peer_stores.h"
#include "xla_ffi/comm/trace.h"

#include "cutlass/version.h"
#include "xla_ffi/ffi/handlers.h"

namespace py = pybind11;

// setup.py's digest of xla_ffi/kernels and xla_ffi/comm (what a tuned plan's speed depends on).
#ifndef FO_KERNEL_BUILD
#define FO_KERNEL_BUILD ""
#endif

namespace {

template <typename Fn>
py::capsule EncapsulateHandler(Fn* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

py::dict Registrations() {
  py::dict out;
#define FO_REGISTER(target, symbol) out[target] = EncapsulateHandler(symbol);
  FLASHOVERLAP_FFI_HANDLERS(FO_REGISTER)
#undef FO_REGISTER
  return out;
}

py::dict BuildInfo() {
  py::dict out;
  out["cuda_runtime_compiled"] = CUDART_VERSION;
  out["nccl_headers"] = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                        std::to_string(NCCL_PATCH);
  out["cutlass"] = std::to_string(CUTLASS_MAJOR) + "." + std::to_string(CUTLASS_MINOR) + "." +
                   std::to_string(CUTLASS_PATCH);
  out["cuda_arch"] = "sm_90a";
  out["kernel_build"] = FO_KERNEL_BUILD;
  return out;
}

std::string NcclVersion() {
  int version = 0;
  ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    throw std::runtime_error(std::string("ncclGetVersion failed: ") + ncclGetErrorString(result));
  }
  int major = version / 10000, minor = (version % 10000) / 100, patch = version % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void ThrowIfError(const flashoverlap::Status& status) {
  if (!status.ok()) throw std::runtime_error(status.message);
}

py::bytes NcclUniqueId() {
  ncclUniqueId id;
  ThrowIfError(flashoverlap::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return py::bytes(id.internal, sizeof(id.internal));
}

void CreateCommunicators(int64_t comm_id, const py::bytes& unique_id, int world_size,
                         const std::vector<std::pair<int, int>>& local_rank_device,
                         int comm_sms, size_t workspace_bytes, double watchdog_seconds,
                         bool peer_to_peer, int cta_policy) {
  std::string raw = unique_id;
  if (raw.size() != sizeof(ncclUniqueId::internal)) {
    throw std::invalid_argument("unique_id must be " +
                                std::to_string(sizeof(ncclUniqueId::internal)) + " bytes");
  }
  ncclUniqueId id;
  std::memcpy(id.internal, raw.data(), raw.size());
  std::vector<flashoverlap::LocalRank> local;
  for (auto [rank, device] : local_rank_device) local.push_back({rank, device});
  flashoverlap::Status status;
  {
    py::gil_scoped_release release;  // NCCL init blocks until every rank has joined
    status = flashoverlap::CreateCommunicators(comm_id, id, world_size, local, comm_sms,
                                               workspace_bytes, watchdog_seconds, peer_to_peer,
                                               cta_policy);
  }
  ThrowIfError(status);
}

void SetFaultInjection(const std::string& kind, int calls) {
  flashoverlap::FaultKind k;
  if (kind == "none") k = flashoverlap::FaultKind::kNone;
  else if (kind == "nccl") k = flashoverlap::FaultKind::kNccl;
  else if (kind == "cuda") k = flashoverlap::FaultKind::kCuda;
  else throw std::invalid_argument("kind must be 'none', 'nccl' or 'cuda', got '" + kind + "'");
  if (calls < 0) throw std::invalid_argument("calls must be >= 0");
  flashoverlap::SetFaultInjection(k, calls);
}

// A step that may wait (for calls in flight, for peers to join): other Python threads go on.
template <class Step>
void RunWithoutGil(Step step) {
  flashoverlap::Status status;
  {
    py::gil_scoped_release release;
    status = step();
  }
  ThrowIfError(status);
}

void EnsureWorkspace(int64_t comm_id, size_t bytes) {
  RunWithoutGil([&] { return flashoverlap::EnsureWorkspace(comm_id, bytes); });
}

void EnsurePeerStores(int64_t comm_id, size_t recv_bytes, bool stage_mirrors, bool grant_results) {
  RunWithoutGil([&] {
    return flashoverlap::EnsurePeerStores(comm_id, recv_bytes, stage_mirrors, grant_results);
  });
}

// (writable, how allocated) of the device memory at `ptr` for GPU `peer` (peer_access.h).
py::tuple PeerMayWrite(uintptr_t ptr, int peer) {
  bool writable = false;
  std::string kind;
  ThrowIfError(flashoverlap::PeerMayWrite(reinterpret_cast<const void*>(ptr), peer, &writable, &kind));
  return py::make_tuple(writable, kind);
}

// Gives GPUs `peers` read-write access to the allocation holding `ptr`; its kind (peer_access.h).
std::string GrantPeersWrite(uintptr_t ptr, const std::vector<int>& peers) {
  std::string kind;
  ThrowIfError(flashoverlap::GrantPeersWrite(reinterpret_cast<const void*>(ptr), peers, &kind));
  return kind;
}

// [(device, rank, record bytes)] of this process's members of comm_id (groups spanning
// processes: the records the other processes import; peer_stores.h).
py::list ExportPeerStores(int64_t comm_id) {
  std::vector<flashoverlap::PeerStoresRecord> records;
  RunWithoutGil([&] { return flashoverlap::ExportPeerStores(comm_id, &records); });
  py::list out;
  for (const auto& r : records) out.append(py::make_tuple(r.device, r.rank, py::bytes(r.bytes)));
  return out;
}

void ReleasePeerStores(int64_t comm_id, size_t recv_bytes) {
  RunWithoutGil([&] { return flashoverlap::ReleasePeerStores(comm_id, recv_bytes); });
}

void ImportPeerStores(int64_t comm_id, const std::map<int, std::vector<py::bytes>>& by_device) {
  std::map<int, std::vector<std::string>> records;
  for (const auto& [device, list] : by_device)
    for (const py::bytes& b : list) records[device].push_back(std::string(b));
  RunWithoutGil([&] { return flashoverlap::ImportPeerStores(comm_id, records); });
}

void ConnectPeers(int64_t comm_id) {  // waits for the peers of every group (bounded: agreement.h)
  RunWithoutGil([&] { return flashoverlap::ConnectPeers(comm_id); });
}

void DestroyCommunicators(int64_t comm_id) {
  RunWithoutGil([&] { return flashoverlap::DestroyCommunicators(comm_id); });
}

py::list ListCommunicators() {
  std::vector<flashoverlap::CommunicatorSummary> summaries;
  {
    // Waits while communicators are made or a workspace grows (up to kGrowWaitSeconds): other
    // Python threads must go on meanwhile.
    py::gil_scoped_release release;
    summaries = flashoverlap::ListCommunicators();
  }
  py::list out;
  for (const auto& c : summaries) {
    py::dict d;
    d["comm_id"] = c.comm_id;
    d["device"] = c.device;
    d["rank"] = c.rank;
    d["world_size"] = c.world_size;
    d["comm_sms"] = c.comm_sms;
    d["workspace_bytes"] = c.workspace_bytes;
    d["wait_method"] = c.wait_method;
    d["write_method"] = c.write_method;
    d["watchdog_seconds"] = c.watchdog_seconds;
    d["aborted"] = c.aborted;
    d["peer_to_peer"] = c.peer_to_peer;
    d["cta_policy"] = c.cta_policy;
    d["workspace_error"] = c.workspace_error;
    d["peer_recv_bytes"] = c.peer_recv_bytes;
    d["peer_broken"] = c.peer_broken;
    d["peer_across_processes"] = c.peer_across_processes;
    d["peer_staged"] = c.peer_staged;
    d["peer_grants"] = c.peer_grants;
    d["peer_connected"] = c.peer_connected;
    out.append(d);
  }
  return out;
}

void SetTrace(bool enabled, int capacity) {
  flashoverlap::Status status = flashoverlap::SetTraceEnabled(enabled, capacity);
  if (!status.ok()) throw std::invalid_argument(status.message);
}

py::list ReadTrace(bool clear) {
  std::vector<flashoverlap::TracedCall> calls;
  flashoverlap::Status status;
  {
    py::gil_scoped_release release;  // waits for the traced calls' events
    status = flashoverlap::ReadTrace(clear, &calls);
  }
  ThrowIfError(status);
  py::list out;
  for (const auto& c : calls) {
    py::dict d;
    d["op"] = c.op;
    d["device"] = c.device;
    d["rank"] = c.rank;
    d["world_size"] = c.world_size;
    d["comm_sms"] = c.comm_sms;
    d["band_rows"] = c.band_rows;
    d["gemm_done_ms"] = c.gemm_done_ms;
    d["ready_ms"] = c.ready_ms;
    d["comm_done_ms"] = c.comm_done_ms;
    d["copy_done_ms"] = c.copy_done_ms;
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_xla_ffi, m) {
  m.doc() = "jax_flashoverlap CUDA extension: XLA FFI handlers and NCCL communicator setup";
  m.def("registrations", &Registrations, "FFI target name -> handler capsule (platform CUDA)");
  m.def("build_info", &BuildInfo, "Versions the extension was compiled against");
  m.def("nccl_version", &NcclVersion, "Version of the NCCL library loaded at run time");
  m.def("nccl_unique_id", &NcclUniqueId, "A new ncclUniqueId, as bytes");
  m.def("create_communicators", &CreateCommunicators, py::arg("comm_id"), py::arg("unique_id"),
        py::arg("world_size"), py::arg("local_rank_device"), py::arg("comm_sms"),
        py::arg("workspace_bytes"), py::arg("watchdog_seconds") = 0.0,
        py::arg("peer_to_peer") = false, py::arg("cta_policy") = 0,
        "Creates this process's communicators of one group (all local ranks at once); "
        "watchdog_seconds > 0 watches their calls (xla_ffi/comm/watchdog.h); peer_to_peer: "
        "for ncclSend/ncclRecv ops (workspace not registered with NCCL); cta_policy: "
        "ncclConfig_t.CTAPolicy (0 default, 1 efficiency, 2 zero)");
  m.def("ensure_workspace", &EnsureWorkspace, py::arg("comm_id"), py::arg("bytes"),
        "Grows the workspaces of comm_id to at least `bytes`");
  m.def("ensure_peer_stores", &EnsurePeerStores, py::arg("comm_id"), py::arg("recv_bytes"),
        py::arg("stage_mirrors") = false, py::arg("grant_results") = false,
        "Gives comm_id's local members peer-store buffers of at least `recv_bytes` each "
        "(groups of 2 to 8 ranks, all local or one per process; xla_ffi/comm/peer_stores.h); "
        "stage_mirrors: a group in this process stages its all-reduce's mirrors too; "
        "grant_results: its all-reduce gives the others access to a result they may not write");
  m.def("peer_may_write", &PeerMayWrite, py::arg("ptr"), py::arg("peer"),
        "(writable, kind): whether GPU `peer` may write the device memory at `ptr`, and how "
        "it was allocated ('legacy', 'pool' or 'vmm'; xla_ffi/comm/peer_access.h)");
  m.def("grant_peers_write", &GrantPeersWrite, py::arg("ptr"), py::arg("peers"),
        "Gives GPUs `peers` read-write access to the allocation holding the device memory at "
        "`ptr` (its whole mapping, or its pool); returns how it was allocated (peer_access.h)");
  m.def("export_peer_stores", &ExportPeerStores, py::arg("comm_id"),
        "[(device, rank, record bytes)] of this process's peer-store buffers of comm_id, for "
        "the other processes of groups that span processes (xla_ffi/comm/peer_stores.h)");
  m.def("release_peer_stores", &ReleasePeerStores, py::arg("comm_id"), py::arg("recv_bytes"),
        "Before a growth to recv_bytes of groups spanning processes: closes this process's "
        "mappings of the other ranks' buffers (every process, then a barrier, then the growth)");
  m.def("import_peer_stores", &ImportPeerStores, py::arg("comm_id"), py::arg("records_by_device"),
        "Opens, for each local device of comm_id, its group's records (one per rank, in rank "
        "order) from export_peer_stores of every process");
  m.def("connect_peers", &ConnectPeers, py::arg("comm_id"),
        "Sets up the point-to-point connections of comm_id's local communicators now (a peer "
        "that never comes: an error after the setup agreement's bound, members aborted)");
  m.def("destroy_communicators", &DestroyCommunicators, py::arg("comm_id") = 0,
        "Destroys the communicators of comm_id (0: all)");
  m.def("has_communicators", &flashoverlap::HasCommunicators, py::arg("comm_id"));
  m.def("list_communicators", &ListCommunicators);
  m.def("set_fault_injection", &SetFaultInjection, py::arg("kind"), py::arg("calls"),
        "Testing only: the next `calls` overlapped calls of every device fail at their first "
        "communication step with an injected NCCL / CUDA error");
  m.def("set_trace", &SetTrace, py::arg("enabled"), py::arg("capacity"),
        "Turns the per-group timeline of the overlapped calls on or off (xla_ffi/comm/trace.h); "
        "`capacity` calls are kept per device, the oldest dropped first");
  m.def("read_trace", &ReadTrace, py::arg("clear"),
        "The traced calls of every device (times in ms after each call's start; waits for "
        "them); clear: empties the rings");
  m.def("trace_enabled", &flashoverlap::TraceEnabled);
  m.def("trace_dropped", &flashoverlap::TraceDropped,
        "Traced calls dropped (ring full) since the last clearing read");
}
