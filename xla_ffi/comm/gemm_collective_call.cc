// GEMM + all-reduce / reduce-scatter: signaling GEMM on the compute stream, one NCCL call per
// group on our communication stream as soon as the group's counter says it is complete.
//
// Data flow (DESIGN.md): reset counters, order the comm stream after everything before us,
// GEMM into the registered workspace, per group: wait counter -> NCCL (-> copy to the output
// on the copy stream for all-reduce), then join both streams back.
#include <nccl.h>

#include <mutex>
#include <string>

#include "xla_ffi/comm/call_frame.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/comm/trace.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

// Group g's span [rows of every block] is contiguous in the workspace (group layout):
// all-reduce it in place and copy it out, or reduce-scatter it to its rows of the result.
Status EnqueueGroupCollective(Communicator& comm, CollectiveKind kind, char* span,
                              char* result_rows, int64_t count, GemmDType dtype,
                              int g, CallTrace& trace) {
  if (kind == CollectiveKind::kReduceScatter) {
    FO_RETURN_IF_NOT_OK(NcclStatus(ncclReduceScatter(span, result_rows, count, NcclType(dtype),
                                                     ncclSum, comm.comm, comm.stream),
                                   "ncclReduceScatter"));
    return trace.CommDone(g);
  }
  FO_RETURN_IF_NCCL(ncclAllReduce(span, span, count, NcclType(dtype), ncclSum, comm.comm,
                                  comm.stream));
  // Before group_reduced: the copy's trace event then follows comm_done by stream order.
  FO_RETURN_IF_NOT_OK(trace.CommDone(g));
  if (span == result_rows) return Status::Ok();  // in place on the output: nothing to copy
  // The copy (copy engine) overlaps the next group's all-reduce.
  FO_RETURN_IF_CUDA(cudaEventRecord(comm.group_reduced[g], comm.stream));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.copy_stream, comm.group_reduced[g], 0));
  FO_RETURN_IF_CUDA(cudaMemcpyAsync(result_rows, span, count * 2, cudaMemcpyDeviceToDevice,
                                    comm.copy_stream));
  return trace.CopyDone(g);
}

// Equal bands of `rows` rows each (RunCollectiveOnly's groups), for its trace.
GroupLayout EqualBands(int groups, int64_t rows) {
  GroupLayout layout;
  layout.num_groups = groups;
  for (int g = 0; g <= groups; ++g) layout.band_rows[g] = static_cast<int>(g * rows);
  return layout;
}

}  // namespace

Status RunGemmCollective(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         SignalingGemmArgs gemm, void* result, bool poison_workspace,
                         const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(BeginCall(comm, stream, op));
  gemm.counters = comm.counters;  // read under the lock: a destroy clears it (overlap_calls.h)
  // gemm.out == result: the GEMM writes `result` itself, an all-reduce in place on XLA's
  // output (no workspace, no copies). A reduce-scatter's result is smaller than the GEMM's
  // output: never in place.
  const bool in_place = gemm.out != nullptr;
  if (in_place && (gemm.out != result || kind != CollectiveKind::kAllReduce)) {
    return Status::Error(std::string(op) + ": only an all-reduce can run in place on its output");
  }
  char* workspace = nullptr;
  FO_RETURN_IF_NOT_OK(UseWorkspace(comm, stream,
                                   in_place ? 0 : static_cast<size_t>(gemm.m) * gemm.n * 2,
                                   poison_workspace, op, &workspace));
  if (!in_place) gemm.out = workspace;
  const bool copies = kind == CollectiveKind::kAllReduce && !in_place;
  const int groups = gemm.layout.num_groups;
  CallTrace trace;
  Status status = CatchExceptions([&]() -> Status {
    Status steps = PrepareGemmHelpers(comm, gemm);
    if (steps.ok()) steps = StartCall(comm, stream, groups, copies);
    if (steps.ok()) steps = trace.Begin(comm, stream, op, gemm.layout, /*gemm=*/true, copies);
    if (steps.ok()) steps = LaunchGemm(comm, gemm, stream);
    // Helpers (signaling_gemm.h): before each group's wait, a small grid on the SMs the
    // collectives leave idle takes units up to that group's end, then frees them for its NCCL
    // call (stream order).
    const bool helpers = steps.ok() && gemm.helpers && HelperClusters() > 0;
    if (steps.ok()) steps = trace.GemmDone(stream);
    if (steps.ok()) steps = TakeInjectedFault(comm.device);
    if (steps.ok() && helpers) steps = WaitForQueueReset(comm);

    const int64_t blocks = gemm.layout.num_blocks;
    const size_t row_bytes = static_cast<size_t>(gemm.n) * 2;
    char* gemm_out = static_cast<char*>(gemm.out);
    char* out = static_cast<char*>(result);
    for (int g = 0; g < groups && steps.ok(); ++g) {
      const int64_t b0 = gemm.layout.band_rows[g];
      const int64_t band = gemm.layout.band_rows[g + 1] - b0;
      if (helpers) steps = LaunchGemmHelpers(comm, gemm, g);
      if (steps.ok()) {
        steps = EnqueueWaitGeq(comm.stream, comm.counters + g,
                               static_cast<int32_t>(TilesInGroup(gemm, g)), comm.wait_method,
                               comm.abort_flag);
      }
      if (steps.ok()) steps = trace.Ready(g);
      if (steps.ok()) {
        steps = EnqueueGroupCollective(comm, kind, gemm_out + blocks * b0 * row_bytes,
                                       out + b0 * row_bytes, band * gemm.n, gemm.dtype, g, trace);
      }
    }
    return steps;
  });
  // The all-reduce's copy stream joins too: the next call's GEMM must not overwrite a span
  // still being copied.
  return trace.End(FinishCall(comm, stream, copies, status, op));
}

Status RunCollectiveOnly(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         int64_t m, int64_t n, GemmDType dtype, int groups, void* result,
                         const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(BeginCall(comm, stream, op));
  const bool copies = kind == CollectiveKind::kAllReduce;
  char* workspace = nullptr;
  FO_RETURN_IF_NOT_OK(UseWorkspace(comm, stream, static_cast<size_t>(m) * n * 2,
                                   /*poison=*/false, op, &workspace));
  char* out = static_cast<char*>(result);
  const int64_t group_elems = m / groups * n;
  const int64_t out_elems = kind == CollectiveKind::kReduceScatter ? group_elems / comm.world_size
                                                                   : group_elems;
  CallTrace trace;
  Status status = CatchExceptions([&]() -> Status {
    Status steps = StartCall(comm, stream, /*counters=*/0, copies);
    if (steps.ok()) {
      steps = trace.Begin(comm, stream, op, EqualBands(groups, out_elems / n), /*gemm=*/false,
                          copies);
    }
    for (int g = 0; g < groups && steps.ok(); ++g) {
      steps = trace.Ready(g);
      if (steps.ok()) {
        steps = EnqueueGroupCollective(comm, kind, workspace + g * group_elems * 2,
                                       out + g * out_elems * 2, out_elems, dtype, g, trace);
      }
    }
    return steps;
  });
  return trace.End(FinishCall(comm, stream, copies, status, op));
}

}  // namespace flashoverlap
