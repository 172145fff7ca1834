// XLA FFI handler of the GEMM + all-to-all (issue #9):
//
//   GemmAllToAllImpl -> FlashoverlapGemmAllToAll -> "flashoverlap_gemm_all_to_all"
//
// y = x[M, K] @ w[K, N]; result = all_to_all(y, split_axis, concat_axis, tiled=True) over
// the n ranks of the communicator. Seen as blocks: y is n blocks of R x C, block j for rank
// j, and the result is n blocks of R x C, block s from rank s.
//   split 0: blocks are row blocks (R = M/n, C = N). The GEMM writes the reduce-scatter
//            group layout (num_blocks = n): group g = band g of every row block, stored as
//            [band g of block 0 | band g of block 1 | ...]; part j (h x C) goes to rank j.
//   split 1: blocks are column blocks (R = M, C = N/n). The GEMM writes y column-blocked,
//            [n, M, C] (out_col_block = C); group g = rows [b_g, b_g+1) of all columns; its
//            part j, rows [b_g, b_g+1) of column block j, is contiguous h x C.
// band_rows (the plan) run from 0 to R. Once group g's counter is complete: one
// ncclGroupStart / {ncclSend part p to p, ncclRecv from p} for every peer p / ncclGroupEnd
// on the communication stream C, and the own part by a copy on the copy stream K. What
// arrives from rank s is rows [b_g, b_g+1) of result block s:
//   concat 0: result [n*R, C] row-major: received straight into XLA's output;
//   concat 1: result [R, n*C] (block s = columns [s*C, (s+1)*C)): received into a staging
//             half of the workspace, then moved by 2-D copies on K (copy engine).
// Every rank issues the same groups in the same order (the plan is part of the program),
// so the grouped sends and receives pair up.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/watchdog.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/comm_call.h"
#include "xla_ffi/ffi/handlers.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {
namespace {

constexpr const char* kOp = "flashoverlap_gemm_all_to_all";

struct A2aShape {
  int64_t m, k, n;  // the GEMM
  int64_t world;
  int64_t rows, cols;  // R, C: one block of y and of the result
  int split, concat;
};

ffi::Error ValidateA2a(const Communicator* comm, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       const ffi::AnyBuffer& out, int32_t world_size, int32_t split,
                       int32_t concat, ffi::Span<const int32_t> band_rows, int64_t comm_id,
                       int device, A2aShape* shape) {
  FO_RETURN_IF_ERROR(CheckCommunicator(kOp, comm, world_size, comm_id, device));
  FO_CHECK_ARG((split == 0 || split == 1) && (concat == 0 || concat == 1),
               kOp << ": split_axis and concat_axis must be 0 or 1, got " << split << " and "
                   << concat);
  FO_RETURN_IF_ERROR(CheckGemmOperands(kOp, x, w, out));
  const int64_t m = x.dimensions()[0], k = x.dimensions()[1], n = w.dimensions()[1];
  const int64_t world = world_size;
  auto od = out.dimensions();
  FO_CHECK_ARG(world >= 1, kOp << ": world_size must be >= 1");
  int64_t rows, cols;
  if (split == 0) {
    FO_CHECK_ARG(m % world == 0, kOp << ": split_axis 0 needs M=" << m
                                     << " divisible by the world size " << world);
    rows = m / world;
    cols = n;
  } else {
    FO_CHECK_ARG(n % (8 * world) == 0, kOp << ": split_axis 1 needs N=" << n
                                           << " divisible by 8 * world size " << 8 * world);
    rows = m;
    cols = n / world;
  }
  const int64_t want0 = concat == 0 ? world * rows : rows;
  const int64_t want1 = concat == 0 ? cols : world * cols;
  FO_CHECK_ARG(od[0] == want0 && od[1] == want1,
               kOp << ": output must be [" << want0 << ", " << want1 << "], got [" << od[0]
                   << ", " << od[1] << "]");
  const int64_t groups = static_cast<int64_t>(band_rows.size()) - 1;
  FO_CHECK_ARG(groups >= 1 && groups <= kMaxGroups,
               kOp << ": plan has " << groups << " groups; 1.." << kMaxGroups << " allowed");
  FO_CHECK_ARG(band_rows[0] == 0 && band_rows[groups] == rows,
               kOp << ": plan band_rows must run from 0 to " << rows);
  for (int64_t g = 0; g < groups; ++g) {
    FO_CHECK_ARG(band_rows[g] < band_rows[g + 1], kOp << ": plan band_rows must increase");
  }
  FO_RETURN_IF_ERROR(
      CheckWorkspace(kOp, *comm, static_cast<size_t>(m) * n * 2 * (concat == 1 ? 2 : 1)));
  *shape = {m, k, n, world, rows, cols, split, concat};
  return ffi::Error::Success();
}

// Element offset of group g's part for rank j in the GEMM's output (the send buffer).
int64_t SendOffset(const A2aShape& s, int64_t b0, int64_t h, int64_t j) {
  return s.split == 0 ? (s.world * b0 + j * h) * s.cols : (j * s.rows + b0) * s.cols;
}

// Element offset of group g's rows of result block `src` in the [n, R, C] receive layout.
int64_t RecvOffset(const A2aShape& s, int64_t b0, int64_t src) {
  return (src * s.rows + b0) * s.cols;
}

Status EnqueueGroup(Communicator* comm, const A2aShape& s, const SignalingGemmArgs& args, int g,
                    int64_t b0, int64_t h, char* send, char* recv, char* result,
                    ncclDataType_t dtype) {
  const int64_t rank = comm->rank;
  const size_t part_bytes = static_cast<size_t>(h * s.cols) * 2;
  FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(comm->stream, comm->counters + g,
                                     static_cast<int32_t>(TilesInGroup(args, g)),
                                     comm->wait_method, comm->abort_flag));
  if (s.concat == 0) {  // own part: copy engine, beside the exchange
    FO_RETURN_IF_CUDA(cudaEventRecord(comm->group_reduced[g], comm->stream));
    FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm->copy_stream, comm->group_reduced[g], 0));
    FO_RETURN_IF_CUDA(cudaMemcpyAsync(recv + RecvOffset(s, b0, rank) * 2,
                                      send + SendOffset(s, b0, h, rank) * 2, part_bytes,
                                      cudaMemcpyDeviceToDevice, comm->copy_stream));
  }
  if (s.world > 1) {
    FO_RETURN_IF_NCCL(ncclGroupStart());
    for (int64_t p = 0; p < s.world; ++p) {
      if (p == rank) continue;
      ncclResult_t res = ncclSend(send + SendOffset(s, b0, h, p) * 2, h * s.cols, dtype,
                                  static_cast<int>(p), comm->comm, comm->stream);
      if (res == ncclSuccess) {
        res = ncclRecv(recv + RecvOffset(s, b0, p) * 2, h * s.cols, dtype, static_cast<int>(p),
                       comm->comm, comm->stream);
      }
      if (res != ncclSuccess) {
        ncclGroupEnd();
        return NcclStatus(res, "ncclSend/ncclRecv");
      }
    }
    FO_RETURN_IF_NCCL(ncclGroupEnd());
  }
  if (s.concat == 1) {  // every source's rows into its columns of the [R, n*C] result
    FO_RETURN_IF_CUDA(cudaEventRecord(comm->group_reduced[g], comm->stream));
    FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm->copy_stream, comm->group_reduced[g], 0));
    const size_t row_bytes = static_cast<size_t>(s.cols) * 2;
    for (int64_t src = 0; src < s.world; ++src) {
      const char* from = src == rank ? send + SendOffset(s, b0, h, rank) * 2
                                     : recv + RecvOffset(s, b0, src) * 2;
      char* to = result + (b0 * s.world * s.cols + src * s.cols) * 2;
      FO_RETURN_IF_CUDA(cudaMemcpy2DAsync(to, s.world * row_bytes, from, row_bytes, row_bytes,
                                          static_cast<size_t>(h), cudaMemcpyDeviceToDevice,
                                          comm->copy_stream));
    }
  }
  return Status::Ok();
}

ffi::Error GemmAllToAllImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                            ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int64_t comm_id,
                            int32_t world_size, int32_t comm_sms, int32_t split_axis,
                            int32_t concat_axis, ffi::Span<const int32_t> band_rows) {
  Communicator* comm = FindCommunicator(comm_id, device);
  A2aShape s;
  FO_RETURN_IF_ERROR(ValidateA2a(comm, x, w, *out, world_size, split_axis, concat_axis,
                                 band_rows, comm_id, device, &s));
  std::lock_guard<std::mutex> lock(comm->call_mutex);
  FO_RETURN_IF_ERROR(CheckAlive(kOp, *comm));

  const bool bf16 = x.element_type() == ffi::DataType::BF16;
  const int groups = static_cast<int>(band_rows.size()) - 1;
  SignalingGemmArgs args =
      GemmArgs(x.untyped_data(), s.m, w, comm->workspace, comm->counters, comm_sms);
  args.layout.num_blocks = s.split == 0 ? static_cast<int>(s.world) : 1;
  args.layout.num_groups = groups;
  for (int g = 0; g <= groups; ++g) args.layout.band_rows[g] = band_rows[g];
  args.out_col_block = s.split == 1 ? static_cast<int>(s.cols) : 0;

  FO_RETURN_IF_ERROR(StartCall(*comm, stream, groups, /*copies=*/true));
  cudaError_t launched = LaunchSignalingGemm(args, stream);
  FO_CHECK(launched == cudaSuccess, kOp << ": signaling GEMM launch failed: "
                                        << cudaGetErrorString(launched) << " ("
                                        << LastSignalingGemmError() << ")");

  char* send = static_cast<char*>(comm->workspace);
  char* result = static_cast<char*>(out->untyped_data());
  char* recv = s.concat == 0 ? result : send + static_cast<size_t>(s.m) * s.n * 2;
  const ncclDataType_t dtype = bf16 ? ncclBfloat16 : ncclFloat16;
  Status status;
  for (int g = 0; g < groups && status.ok(); ++g) {
    status = EnqueueGroup(comm, s, args, g, band_rows[g], band_rows[g + 1] - band_rows[g], send,
                          recv, result, dtype);
  }
  // Both streams join back (parts may still be sent or copied).
  return FinishCall(kOp, *comm, stream, /*copies=*/true, status);
}

auto BindGemmAllToAll() {
  return BindOverlapCall()
      .Attr<int32_t>("split_axis")
      .Attr<int32_t>("concat_axis")
      .Attr<ffi::Span<const int32_t>>("band_rows");
}

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapGemmAllToAll, flashoverlap::GemmAllToAllImpl,
                              flashoverlap::BindGemmAllToAll());
