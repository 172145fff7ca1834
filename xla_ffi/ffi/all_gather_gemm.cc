// XLA FFI handler of the all-gather + GEMM (issue #9; the sequence-parallel column-parallel
// layer):
//
//   AllGatherGemmImpl -> FlashoverlapAllGatherGemm -> "flashoverlap_all_gather_gemm"
//
// out[n*R, N] = all_gather(x[R, K], tiled) @ w[K, N] over the n ranks of the communicator.
// The gathered x lives in the registered workspace ([n*R, K], block s = rank s's rows). Each
// block is `chunks` chunks of F = R/chunks rows, each with a readiness flag (the
// communicator's counters, reset every call, set to a fresh value):
//
//   S (XLA's stream): reset flags; record E0;
//   C (comm stream):  wait E0; for step s = 1..n-1: src = (r+s)%n, dst = (r-s)%n, for each
//                     chunk c: ncclGroupStart/ncclSend(x chunk c -> dst)/ncclRecv(block src
//                     chunk c <- src)/ncclGroupEnd, then cuStreamWriteValue32(flag, value);
//   S:                copy x into block r; set block r's flags; signaling GEMM over the
//                     workspace with row_rotation r*R (local rows first, then the blocks in
//                     the order they arrive), each tile's producer waiting for its chunk's
//                     flag before its first TMA load; out straight into XLA's output;
//                     wait for C.
//
// The comm stream never waits for the GEMM (only the GEMM for the comm stream), and the
// GEMM leaves comm_sms >= 1 SMs free, so NCCL always progresses. C's work is enqueued
// before the GEMM is launched: a first launch loads the GEMM's module, which waits for
// running kernels, and nothing C needs may be stuck behind the spinning GEMM.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/watchdog.h"
#include "xla_ffi/comm/stream_write.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/comm_call.h"
#include "xla_ffi/ffi/handlers.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {
namespace {

constexpr const char* kOp = "flashoverlap_all_gather_gemm";

// A value no flag holds before this call: flags are reset to 0 every call, and values
// never repeat between consecutive calls (belt and braces against a stale flag).
int32_t NextFlagValue() {
  static std::atomic<uint32_t> next{0};
  return static_cast<int32_t>(next.fetch_add(1, std::memory_order_relaxed) % 0x7ffffffeu) + 1;
}

ffi::Error ValidateAg(const Communicator* comm, ffi::AnyBuffer x, ffi::AnyBuffer w,
                      const ffi::AnyBuffer& out, int32_t world_size, int32_t comm_sms,
                      int32_t chunks, int64_t comm_id, int device) {
  FO_RETURN_IF_ERROR(CheckCommunicator(kOp, comm, world_size, comm_id, device));
  FO_CHECK_ARG(comm_sms >= 1 && comm->comm_sms >= 1,
               kOp << ": comm_sms must be >= 1 (got " << comm_sms << ", communicator "
                   << comm->comm_sms << "): NCCL needs free SMs while the GEMM waits for it");
  FO_RETURN_IF_ERROR(CheckGemmOperands(kOp, x, w, out));
  const int64_t r = x.dimensions()[0], k = x.dimensions()[1], n = w.dimensions()[1];
  auto od = out.dimensions();
  FO_CHECK_ARG(od[0] == world_size * r && od[1] == n,
               kOp << ": output must be [" << world_size * r << ", " << n << "]");
  FO_CHECK_ARG(chunks >= 1 && r % chunks == 0 &&
                   static_cast<int64_t>(world_size) * chunks <= kMaxGroups,
               kOp << ": chunks=" << chunks << " must divide the " << r
                   << " rows of x and world_size * chunks must be <= " << kMaxGroups);
  return CheckWorkspace(kOp, *comm, static_cast<size_t>(world_size) * r * k * 2);
}

// C's part: the n-1 exchange steps, each chunk announced by its flag.
Status EnqueueExchange(Communicator* comm, const char* x, char* gathered, int64_t rows,
                       int64_t k, int chunks, int32_t value, ncclDataType_t dtype) {
  const int n = comm->world_size, rank = comm->rank;
  const int64_t chunk_rows = rows / chunks;
  const size_t count = static_cast<size_t>(chunk_rows * k);
  for (int step = 1; step < n; ++step) {
    const int src = (rank + step) % n, dst = (rank - step + n) % n;
    for (int c = 0; c < chunks; ++c) {
      FO_RETURN_IF_NCCL(ncclGroupStart());
      ncclResult_t res = ncclSend(x + c * count * 2, count, dtype, dst, comm->comm, comm->stream);
      if (res == ncclSuccess) {
        res = ncclRecv(gathered + (src * rows + c * chunk_rows) * k * 2, count, dtype, src,
                       comm->comm, comm->stream);
      }
      if (res != ncclSuccess) {
        ncclGroupEnd();
        return NcclStatus(res, "ncclSend/ncclRecv");
      }
      FO_RETURN_IF_NCCL(ncclGroupEnd());
      FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(comm->stream, comm->counters + src * chunks + c, value));
    }
  }
  return Status::Ok();
}

ffi::Error AllGatherGemmImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                             ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int64_t comm_id,
                             int32_t world_size, int32_t comm_sms, int32_t chunks) {
  Communicator* comm = FindCommunicator(comm_id, device);
  FO_RETURN_IF_ERROR(ValidateAg(comm, x, w, *out, world_size, comm_sms, chunks, comm_id, device));
  std::lock_guard<std::mutex> lock(comm->call_mutex);
  FO_RETURN_IF_ERROR(CheckAlive(kOp, *comm));

  const int64_t rows = x.dimensions()[0], k = x.dimensions()[1];
  const int n = world_size, rank = comm->rank;
  const bool bf16 = x.element_type() == ffi::DataType::BF16;
  const int32_t value = NextFlagValue();
  char* gathered = static_cast<char*>(comm->workspace);
  const size_t block_bytes = static_cast<size_t>(rows * k) * 2;

  FO_RETURN_IF_ERROR(StartCall(*comm, stream, n * chunks, /*copies=*/false));
  Status status = EnqueueExchange(comm, static_cast<const char*>(x.untyped_data()), gathered,
                                  rows, k, chunks, value, bf16 ? ncclBfloat16 : ncclFloat16);

  if (status.ok()) {
    status = CudaStatus(cudaMemcpyAsync(gathered + rank * block_bytes, x.untyped_data(),
                                        block_bytes, cudaMemcpyDeviceToDevice, stream),
                        "cudaMemcpyAsync");
  }
  for (int c = 0; c < chunks && status.ok(); ++c) {
    status = EnqueueWriteFlag(stream, comm->counters + rank * chunks + c, value);
  }
  if (status.ok()) {
    // Nothing follows the GEMM: no signal (counters null); it waits on the input flags.
    SignalingGemmArgs args =
        GemmArgs(gathered, n * rows, w, out->untyped_data(), nullptr, comm_sms);
    const int chunk_rows = static_cast<int>(rows / chunks);
    args.layout.num_blocks = 1;
    args.layout.num_groups = n * chunks;
    for (int g = 0; g <= n * chunks; ++g) args.layout.band_rows[g] = g * chunk_rows;
    args.row_rotation = static_cast<int>(rank * rows);
    args.in_flags = comm->counters;
    args.in_flag_rows = chunk_rows;
    args.in_flag_value = value;
    cudaError_t launched = LaunchSignalingGemm(args, stream);
    if (launched != cudaSuccess) {
      status = Status::Error(std::string("signaling GEMM launch failed: ") +
                             cudaGetErrorString(launched) + " (" + LastSignalingGemmError() +
                             ")");
    }
  }
  // Join back even after an error (a failed launch leaves C's sends queued: wait for them).
  return FinishCall(kOp, *comm, stream, /*copies=*/false, status);
}

auto BindAllGatherGemm() { return BindOverlapCall().Attr<int32_t>("chunks"); }

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapAllGatherGemm, flashoverlap::AllGatherGemmImpl,
                              flashoverlap::BindAllGatherGemm());
