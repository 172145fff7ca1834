// GEMM + all-reduce / reduce-scatter: signaling GEMM on the compute stream, one NCCL call per
// group on our communication stream as soon as the group's counter says it is complete.
//
// Data flow (DESIGN.md): reset counters, order the comm stream after everything before us,
// GEMM into the registered workspace, per group: wait counter -> NCCL (-> copy to the output
// on the copy stream for all-reduce), then join both streams back.
#include <nccl.h>

#include <mutex>

#include "xla_ffi/comm/call_frame.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

// Group g's span [rows of every block] is contiguous in the workspace (group layout):
// all-reduce it in place and copy it out, or reduce-scatter it to its rows of the result.
Status EnqueueGroupCollective(Communicator& comm, CollectiveKind kind, char* span,
                              char* result_rows, int64_t count, GemmDType dtype,
                              int g) {
  if (kind == CollectiveKind::kReduceScatter) {
    return NcclStatus(ncclReduceScatter(span, result_rows, count, NcclType(dtype), ncclSum,
                                        comm.comm, comm.stream), "ncclReduceScatter");
  }
  FO_RETURN_IF_NCCL(ncclAllReduce(span, span, count, NcclType(dtype), ncclSum, comm.comm,
                                  comm.stream));
  // The copy (copy engine) overlaps the next group's all-reduce.
  FO_RETURN_IF_CUDA(cudaEventRecord(comm.group_reduced[g], comm.stream));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.copy_stream, comm.group_reduced[g], 0));
  FO_RETURN_IF_CUDA(cudaMemcpyAsync(result_rows, span, count * 2, cudaMemcpyDeviceToDevice,
                                    comm.copy_stream));
  return Status::Ok();
}

}  // namespace

Status RunGemmCollective(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         const SignalingGemmArgs& gemm, void* result, const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(CheckNotAborted(comm, op));
  const bool copies = kind == CollectiveKind::kAllReduce;
  const int groups = gemm.layout.num_groups;
  Status status = StartCall(comm, stream, groups, copies);
  if (status.ok()) status = LaunchGemm(gemm, stream);
  if (status.ok()) status = TakeInjectedFault(comm.device);

  const int64_t blocks = gemm.layout.num_blocks;
  const size_t row_bytes = static_cast<size_t>(gemm.n) * 2;
  char* workspace = static_cast<char*>(gemm.out);
  char* out = static_cast<char*>(result);
  for (int g = 0; g < groups && status.ok(); ++g) {
    const int64_t b0 = gemm.layout.band_rows[g];
    const int64_t band = gemm.layout.band_rows[g + 1] - b0;
    status = EnqueueWaitGeq(comm.stream, comm.counters + g,
                            static_cast<int32_t>(TilesInGroup(gemm, g)), comm.wait_method,
                            comm.abort_flag);
    if (status.ok()) {
      status = EnqueueGroupCollective(comm, kind, workspace + blocks * b0 * row_bytes,
                                      out + b0 * row_bytes, band * gemm.n, gemm.dtype, g);
    }
  }
  // The all-reduce's copy stream joins too: the next call's GEMM must not overwrite a span
  // still being copied.
  return FinishCall(comm, stream, copies, status, op);
}

Status RunCollectiveOnly(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         int64_t m, int64_t n, GemmDType dtype, int groups, void* result,
                         const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(CheckNotAborted(comm, op));
  const bool copies = kind == CollectiveKind::kAllReduce;
  Status status = StartCall(comm, stream, /*counters=*/0, copies);
  char* workspace = static_cast<char*>(comm.workspace);
  char* out = static_cast<char*>(result);
  const int64_t group_elems = m / groups * n;
  const int64_t out_elems = kind == CollectiveKind::kReduceScatter ? group_elems / comm.world_size
                                                                   : group_elems;
  for (int g = 0; g < groups && status.ok(); ++g) {
    status = EnqueueGroupCollective(comm, kind, workspace + g * group_elems * 2,
                                    out + g * out_elems * 2, out_elems, dtype, g);
  }
  return FinishCall(comm, stream, copies, status, op);
}

}  // namespace flashoverlap
