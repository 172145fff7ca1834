#include "xla_ffi/comm/call_frame.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "xla_ffi/comm/gemm_status.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {

Status BeginCall(const Communicator& comm, cudaStream_t stream, const char* op) {
  if (comm.destroyed.load()) {
    return Status::Error(std::string(op) + ": the communicator (comm_id " +
                         std::to_string(comm.comm_id) + ", device " +
                         std::to_string(comm.device) + ") was destroyed "
                         "(jax_flashoverlap.comm.destroy_communicators); lower the op again");
  }
  FO_RETURN_IF_NOT_OK(CheckNotAborted(comm, op));
  // On the stream of every call so far, a wait for work already done: nothing to wait for.
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(stream, comm.call_done, 0));
  return Status::Ok();
}

Status StartCall(Communicator& comm, cudaStream_t stream, int counters, bool copies) {
  if (counters > 0) {
    FO_RETURN_IF_CUDA(cudaMemsetAsync(comm.counters, 0, sizeof(int32_t) * counters, stream));
  }
  FO_RETURN_IF_CUDA(cudaEventRecord(comm.gemm_started, stream));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.stream, comm.gemm_started, 0));
  if (copies) FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.copy_stream, comm.gemm_started, 0));
  return WatchStart(comm);  // the watchdog times the call from here on the GPU
}

Status FollowOnCommStream(Communicator& comm, cudaStream_t stream) {
  FO_RETURN_IF_CUDA(cudaEventRecord(comm.sequence_done, stream));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.stream, comm.sequence_done, 0));
  return Status::Ok();
}

Status UseWorkspace(const Communicator& comm, cudaStream_t stream, size_t bytes, bool poison,
                    const char* op, char** workspace) {
  *workspace = static_cast<char*>(comm.workspace);
  if (comm.workspace_bytes < bytes && !comm.workspace_error.empty()) {
    return Status::Error(std::string(op) + ": no communication workspace on device " +
                         std::to_string(comm.device) + ": allocating it when the op was lowered "
                         "failed (" + comm.workspace_error + "); free device memory "
                         "(XLA_PYTHON_CLIENT_MEM_FRACTION) and lower again");
  }
  if (comm.workspace_bytes < bytes) {
    return Status::Error(std::string(op) + ": communication workspace has " +
                         std::to_string(comm.workspace_bytes) + " bytes, needs " +
                         std::to_string(bytes) + " (jax_flashoverlap.comm.ensure_communicators "
                         "sizes it at lowering)");
  }
  if (poison && comm.workspace != nullptr && comm.workspace_bytes > 0) {
    FO_RETURN_IF_CUDA(cudaMemsetAsync(comm.workspace, 0xFF, comm.workspace_bytes, stream));
  }
  return Status::Ok();
}

Status LaunchGemm(Communicator& comm, SignalingGemmArgs args, cudaStream_t stream) {
  args.queue = comm.gemm_queue;  // ordered on `stream`, like the counters: one call at a time
  return GemmLaunchStatus(LaunchSignalingGemm(args, stream), "signaling GEMM launch");
}

Status PrepareGemmHelpers(Communicator& comm, SignalingGemmArgs& args) {
  const char* v = std::getenv("FLASHOVERLAP_GEMM_HELPERS");
  args.helpers = v != nullptr && std::strcmp(v, "on") == 0;
  args.queue_reset = args.helpers ? comm.queue_reset : nullptr;
  if (v == nullptr || *v == '\0' || args.helpers || std::strcmp(v, "off") == 0) return Status::Ok();
  return Status::Error(std::string("FLASHOVERLAP_GEMM_HELPERS must be 'off' or 'on', got '") + v + "'");
}

int HelperClusters() { return LastSignalingGemmLaunch().helper_clusters; }

Status WaitForQueueReset(Communicator& comm) {
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.stream, comm.queue_reset, 0));
  return Status::Ok();
}

Status LaunchGemmHelpers(Communicator& comm, SignalingGemmArgs args, int until_group) {
  args.queue = comm.gemm_queue;  // as LaunchGemm: the same plan, the same queue
  return GemmLaunchStatus(LaunchSignalingGemmHelpers(args, until_group, comm.stream),
                      "signaling GEMM helper launch");
}

namespace {

// Every step is tried whatever an earlier one said (the first failure is returned): a join
// left out after one that failed would let `stream` run ahead of a stream still in flight.
Status JoinBack(Communicator& comm, cudaStream_t stream, bool copies) {
  Status first = Status::Ok();
  auto keep = [&first](Status s) {
    if (first.ok() && !s.ok()) first = s;
  };
  keep(CudaStatus(cudaEventRecord(comm.comm_done, comm.stream), "cudaEventRecord (comm_done)"));
  keep(CudaStatus(cudaStreamWaitEvent(stream, comm.comm_done, 0), "cudaStreamWaitEvent (comm_done)"));
  if (copies) {
    keep(CudaStatus(cudaEventRecord(comm.copies_done, comm.copy_stream),
                    "cudaEventRecord (copies_done)"));
    keep(CudaStatus(cudaStreamWaitEvent(stream, comm.copies_done, 0),
                    "cudaStreamWaitEvent (copies_done)"));
  }
  keep(CudaStatus(cudaEventRecord(comm.call_done, stream), "cudaEventRecord (call_done)"));
  return first;
}

}  // namespace

Status FinishCall(Communicator& comm, cudaStream_t stream, bool copies, Status status,
                  const char* op) {
  if (status.ok()) status = WatchCall(comm, op);
  if (!status.ok()) WatchAbandon(comm);
  Status joined = JoinBack(comm, stream, copies);
  if (status.ok()) status = joined;
  if (status.ok()) return status;
  return Status::Error(std::string(op) + ": " + status.message);
}

}  // namespace flashoverlap
