// All-gather + GEMM (issue #9; the sequence-parallel column-parallel layer):
// out[n*R, N] = all_gather(x[R, K], tiled) @ w[K, N] over the n ranks of the communicator.
// The gathered x lives in the workspace ([n*R, K], block s = rank s's rows), or, when the
// caller wants it too (`gathered`, e.g. dy of a sequence-parallel row layer's backward, which
// dw needs as well), straight in that buffer in peer-to-peer mode (NCCL receives into it,
// no copy); a collective gather lands in the registered window and C copies it out. Each
// block is `chunks` chunks of F = R/chunks rows, each with a readiness flag (the
// communicator's counters, reset every call, set to a fresh value):
//
//   S (compute stream): reset flags; record E0;
//   C (comm stream):    wait E0; for step s = 1..n-1: src = (r+s)%n, dst = (r-s)%n, for each
//                       chunk c: ncclGroupStart/ncclSend(x chunk c -> dst)/ncclRecv(block src
//                       chunk c <- src)/ncclGroupEnd, then cuStreamWriteValue32(flag, value);
//   S:                  copy x into block r; set block r's flags; signaling GEMM over the
//                       workspace with row_rotation r*R (local rows first, then the blocks in
//                       the order they arrive), each tile's producer waiting for its chunk's
//                       flag before its first TMA load; out straight into the output;
//                       wait for C.
//
// Collective mode (a communicator that is not peer_to_peer: its workspace is a registered
// symmetric window, and made with CTA policy ZERO NCCL can move an all-gather on copy
// engines, leaving the SMs to the GEMM): S copies x into block r of the window first, then C
// runs one in-place ncclAllGather over the window and raises every remote block's flag.
// chunks is 1 there (an all-gather lands whole blocks; chunks of several blocks would not be
// contiguous).
//
// With `gathered` in collective mode, C copies the window into it after the all-gather
// (a device copy beside the GEMM, which keeps reading the window).
//
// The comm stream never waits for the GEMM (only the GEMM for the comm stream), and the GEMM
// leaves comm_sms >= 1 SMs free, so NCCL always progresses. C's work is enqueued before the
// GEMM is launched: a first launch loads the GEMM's module, which waits for running kernels,
// and nothing C needs may be stuck behind the spinning GEMM.
#include <nccl.h>

#include <atomic>
#include <mutex>
#include <string>

#include "xla_ffi/comm/call_frame.h"
#include "xla_ffi/comm/fault_injection.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/comm/stream_write.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

// A value no flag holds before this call: flags are reset to 0 every call, and values never
// repeat between consecutive calls (belt and braces against a stale flag).
int32_t NextFlagValue() {
  static std::atomic<uint32_t> next{0};
  return static_cast<int32_t>(next.fetch_add(1, std::memory_order_relaxed) % 0x7ffffffeu) + 1;
}

// C's part: the n-1 exchange steps, each chunk announced by its flag.
Status EnqueueExchange(Communicator& comm, const char* x, char* gathered, int64_t rows,
                       int64_t k, int chunks, int32_t value, ncclDataType_t dtype) {
  const int n = comm.world_size, rank = comm.rank;
  const int64_t chunk_rows = rows / chunks;
  const size_t count = static_cast<size_t>(chunk_rows * k);
  for (int step = 1; step < n; ++step) {
    const int src = (rank + step) % n, dst = (rank - step + n) % n;
    for (int c = 0; c < chunks; ++c) {
      FO_RETURN_IF_NCCL(ncclGroupStart());
      ncclResult_t res = ncclSend(x + c * count * 2, count, dtype, dst, comm.comm, comm.stream);
      if (res == ncclSuccess) {
        res = ncclRecv(gathered + (src * rows + c * chunk_rows) * k * 2, count, dtype, src,
                       comm.comm, comm.stream);
      }
      if (res != ncclSuccess) {
        ncclGroupEnd();  // closes the group only: `res` is the error reported
        return NcclStatus(res, "ncclSend/ncclRecv");
      }
      FO_RETURN_IF_NCCL(ncclGroupEnd());
      FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(comm.stream, comm.counters + src * chunks + c, value, comm.write_method));
    }
  }
  return Status::Ok();
}

// C's part in collective mode: x's block (already in the window) gathered in place, then the
// remote blocks' flags.
Status EnqueueCollectiveGather(Communicator& comm, char* gathered, int64_t rows, int64_t k,
                               int32_t value, ncclDataType_t dtype) {
  const size_t count = static_cast<size_t>(rows * k);
  FO_RETURN_IF_NCCL(ncclAllGather(gathered + comm.rank * count * 2, gathered, count, dtype,
                                  comm.comm, comm.stream));
  for (int s = 0; s < comm.world_size; ++s) {
    if (s != comm.rank) FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(comm.stream, comm.counters + s, value, comm.write_method));
  }
  return Status::Ok();
}

Status CopyLocalBlock(cudaStream_t stream, char* block, const void* x, size_t bytes) {
  return CudaStatus(cudaMemcpyAsync(block, x, bytes, cudaMemcpyDeviceToDevice, stream),
                    "cudaMemcpyAsync");
}

}  // namespace

Status RunAllGatherGemm(Communicator& comm, cudaStream_t stream, const void* x, int64_t rows,
                        int chunks, SignalingGemmArgs gemm, void* out, void* gathered_out,
                        bool poison_workspace, const char* op) {
  std::lock_guard<std::mutex> lock(comm.call_mutex);
  FO_RETURN_IF_NOT_OK(BeginCall(comm, stream, op));
  const int n = comm.world_size, rank = comm.rank;
  const int64_t k = gemm.k;
  const size_t block_bytes = static_cast<size_t>(rows * k) * 2;
  const bool collective = !comm.peer_to_peer;
  if (collective && chunks != 1) {
    return Status::Error(std::string(op) + ": chunks must be 1 with a collective (all-gather) "
                         "communicator, got " + std::to_string(chunks));
  }
  // Peer-to-peer with a gathered output: the rows land there and the GEMM reads them there.
  const bool in_workspace = collective || gathered_out == nullptr;
  char* workspace = nullptr;
  FO_RETURN_IF_NOT_OK(UseWorkspace(comm, stream, in_workspace ? n * block_bytes : 0,
                                   poison_workspace, op, &workspace));
  char* gathered = in_workspace ? workspace : static_cast<char*>(gathered_out);
  const int32_t value = NextFlagValue();

  // Collective mode: x's block is in the window before C (ordered after S by StartCall)
  // gathers it.
  Status status = CatchExceptions([&]() -> Status {
    Status steps = collective ? CopyLocalBlock(stream, gathered + rank * block_bytes, x,
                                               block_bytes)
                              : Status::Ok();
    if (steps.ok()) steps = StartCall(comm, stream, n * chunks, /*copies=*/false);
    if (steps.ok()) steps = TakeInjectedFault(comm.device);
    if (steps.ok()) {
      steps = collective
                  ? EnqueueCollectiveGather(comm, gathered, rows, k, value, NcclType(gemm.dtype))
                  : EnqueueExchange(comm, static_cast<const char*>(x), gathered, rows, k, chunks,
                                    value, NcclType(gemm.dtype));
    }
    if (steps.ok() && collective && gathered_out != nullptr) {
      steps = CudaStatus(cudaMemcpyAsync(gathered_out, gathered, n * block_bytes,
                                         cudaMemcpyDeviceToDevice, comm.stream),
                         "cudaMemcpyAsync (gathered rows)");
    }
    if (steps.ok() && !collective) {
      steps = CopyLocalBlock(stream, gathered + rank * block_bytes, x, block_bytes);
    }
    for (int c = 0; c < chunks && steps.ok(); ++c) {
      steps = EnqueueWriteFlag(stream, comm.counters + rank * chunks + c, value, comm.write_method);
    }
    if (steps.ok()) {
      // Nothing follows the GEMM: no signal (counters null); it waits on the input flags.
      const int chunk_rows = static_cast<int>(rows / chunks);
      gemm.x = gathered;
      gemm.m = n * rows;
      gemm.out = out;
      gemm.counters = nullptr;
      gemm.layout.num_blocks = 1;
      gemm.layout.num_groups = n * chunks;
      for (int g = 0; g <= n * chunks; ++g) gemm.layout.band_rows[g] = g * chunk_rows;
      gemm.row_rotation = static_cast<int>(rank * rows);
      gemm.in_flags = comm.counters;
      gemm.in_flag_rows = chunk_rows;
      gemm.in_flag_value = value;
      steps = LaunchGemm(comm, gemm, stream);
    }
    return steps;
  });
  // Join back even after an error (a failed launch leaves C's sends queued: wait for them).
  return FinishCall(comm, stream, /*copies=*/false, status, op);
}

}  // namespace flashoverlap
