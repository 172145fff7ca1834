// GEMM + all-to-all (issue #9). Seen as blocks (AllToAllShape): y is n blocks of R x C,
// block j for rank j, and the result is n blocks of R x C, block s from rank s.
//   split 0: blocks are row blocks (R = M/n, C = N). The GEMM writes the reduce-scatter
//            group layout (num_blocks = n): group g = band g of every row block, stored as
//            [band g of block 0 | band g of block 1 | ...]; part j (h x C) goes to rank j.
//   split 1: blocks are column blocks (R = M, C = N/n). The GEMM writes y column-blocked,
//            [n, M, C] (out_col_block = C); group g = rows [b_g, b_g+1) of all columns; its
//            part j, rows [b_g, b_g+1) of column block j, is contiguous h x C.
// Once group g's counter is complete: one ncclGroupStart / {ncclSend part p to p, ncclRecv
// from p} for every peer p / ncclGroupEnd on the communication stream, and the own part by a
// copy on the copy stream. What arrives from rank s is rows [b_g, b_g+1) of result block s:
//   concat 0: result [n*R, C] row-major: received straight into the output;
//   concat 1: result [R, n*C] (block s = columns [s*C, (s+1)*C)): received into a staging
//             half of the workspace, then moved by 2-D copies on the copy stream.
// Every rank issues the same groups in the same order (the plan is part of the program), so
// the grouped sends and receives pair up.
#include <nccl.h>

#include <mutex>

#include "xla_ffi/comm/call_frame.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/comm/trace.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

// Element offset of group g's part for rank j in the GEMM's output (the send buffer).
int64_t SendOffset(const AllToAllShape& s, int64_t b0, int64_t h, int64_t j) {
  return s.split == 0 ? (s.world * b0 + j * h) * s.cols : (j * s.rows + b0) * s.cols;
}

// Element offset of group g's rows of result block `src` in the [n, R, C] receive layout.
int64_t RecvOffset(const AllToAllShape& s, int64_t b0, int64_t src) {
  return (src * s.rows + b0) * s.cols;
}

Status EnqueueExchange(Communicator& comm, const AllToAllShape& s, int64_t b0, int64_t h,
                       char* send, char* recv, ncclDataType_t dtype) {
  FO_RETURN_IF_NCCL(ncclGroupStart());
  for (int64_t p = 0; p < s.world; ++p) {
    if (p == comm.rank) continue;
    ncclResult_t res = ncclSend(send + SendOffset(s, b0, h, p) * 2, h * s.cols, dtype,
                                static_cast<int>(p), comm.comm, comm.stream);
    if (res == ncclSuccess) {
      res = ncclRecv(recv + RecvOffset(s, b0, p) * 2, h * s.cols, dtype, static_cast<int>(p),
                     comm.comm, comm.stream);
    }
    if (res != ncclSuccess) {
      ncclGroupEnd();  // closes the group only: `res` is the error reported
      return NcclStatus(res, "ncclSend/ncclRecv");
    }
  }
  FO_RETURN_IF_NCCL(ncclGroupEnd());
  return Status::Ok();
}

Status EnqueueGroup(Communicator& comm, const AllToAllShape& s, const SignalingGemmArgs& gemm,
                    int g, char* send, char* recv, char* result, ncclDataType_t dtype,
                    CallTrace& trace) {
  const int64_t b0 = gemm.layout.band_rows[g];
  const int64_t h = gemm.layout.band_rows[g + 1] - b0;
  const int64_t rank = comm.rank;
  const size_t part_bytes = static_cast<size_t>(h * s.cols) * 2;
  FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(comm.stream, comm.counters + g,
                                     static_cast<int32_t>(TilesInGroup(gemm, g)),
                                     comm.wait_method, comm.abort_flag));
  FO_RETURN_IF_NOT_OK(trace.Ready(g));
  if (s.concat == 0) {  // own part: copy engine, beside the exchange
    FO_RETURN_IF_CUDA(cudaEventRecord(comm.group_reduced[g], comm.stream));
    FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.copy_stream, comm.group_reduced[g], 0));
    FO_RETURN_IF_CUDA(cudaMemcpyAsync(recv + RecvOffset(s, b0, rank) * 2,
                                      send + SendOffset(s, b0, h, rank) * 2, part_bytes,
                                      cudaMemcpyDeviceToDevice, comm.copy_stream));
  }
  if (s.world > 1) FO_RETURN_IF_NOT_OK(EnqueueExchange(comm, s, b0, h, send, recv, dtype));
  FO_RETURN_IF_NOT_OK(trace.CommDone(g));
  if (s.concat == 1) {  // every source's rows into its columns of the [R, n*C] result
    FO_RETURN_IF_CUDA(cudaEventRecord(comm.group_reduced[g], comm.stream));
    FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.copy_stream, comm.group_reduced[g], 0));
    const size_t row_bytes = static_cast<size_t>(s.cols) * 2;
    for (int64_t src = 0; src < s.world; ++src) {
      const char* from = src == rank ? send + SendOffset(s, b0, h, rank) * 2
                                     : recv + RecvOffset(s, b0, src) * 2;
      char* to = result + (b0 * s.world * s.cols + src * s.cols) * 2;
      FO_RETURN_IF_CUDA(cudaMemcpy2DAsync(to, s.world * row_bytes, from, row_bytes, row_bytes,
                                          static_cast<size_t>(h), cudaMemcpyDeviceToDevice,
                                          comm.copy_stream));
    }
  }
  return trace.CopyDone(g);  // after the group's copies (concat 0: its own part only)
}

}  // namespace

Status RunGemmAllToAll(Communicator& comm, cudaStream_t stream, const AllToAllShape& shape,
                       SignalingGemmArgs gemm, void* result, bool poison_workspace,
                       const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(BeginCall(comm, stream, op));
  gemm.counters = comm.counters;  // read under the lock: a destroy clears it (overlap_calls.h)
  // The GEMM's output, then (concat 1) the staging half.
  const size_t y_bytes = static_cast<size_t>(shape.m) * shape.n * 2;
  char* workspace = nullptr;
  FO_RETURN_IF_NOT_OK(UseWorkspace(comm, stream, y_bytes * (shape.concat == 1 ? 2 : 1),
                                   poison_workspace, op, &workspace));
  gemm.out = workspace;
  const int groups = gemm.layout.num_groups;
  CallTrace trace;
  Status status = CatchExceptions([&]() -> Status {
    Status steps = StartCall(comm, stream, groups, /*copies=*/true);
    if (steps.ok()) steps = trace.Begin(comm, stream, op, gemm.layout, /*gemm=*/true, true);
    if (steps.ok()) steps = LaunchGemm(comm, gemm, stream);
    if (steps.ok()) steps = trace.GemmDone(stream);
    if (steps.ok()) steps = TakeInjectedFault(comm.device);

    char* send = static_cast<char*>(gemm.out);
    char* out = static_cast<char*>(result);
    char* recv = shape.concat == 0 ? out : send + y_bytes;
    const ncclDataType_t dtype = NcclType(gemm.dtype);
    for (int g = 0; g < groups && steps.ok(); ++g) {
      steps = EnqueueGroup(comm, shape, gemm, g, send, recv, out, dtype, trace);
    }
    return steps;
  });
  // Both streams join back (parts may still be sent or copied).
  return trace.End(FinishCall(comm, stream, /*copies=*/true, status, op));
}

}  // namespace flashoverlap
