// XLA FFI handler of the GEMM + all-to-all (issue #9):
//
//   GemmAllToAllImpl -> FlashoverlapGemmAllToAll -> "flashoverlap_gemm_all_to_all"
//
// y = x[M, K] @ w[K, N]; result = all_to_all(y, split_axis, concat_axis, tiled=True) over
// the n ranks of the communicator. Decodes and validates, then hands the call to the
// framework-free sequence (xla_ffi/comm/gemm_all_to_all_call.cc, where the layouts are).
#include <cuda_runtime.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/comm_call.h"
#include "xla_ffi/ffi/handlers.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {
namespace {

constexpr const char* kOp = "flashoverlap_gemm_all_to_all";

ffi::Error ValidateA2a(const Communicator* comm, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       const ffi::AnyBuffer& out, int32_t world_size, int32_t split,
                       int32_t concat, ffi::Span<const int32_t> band_rows, int64_t comm_id,
                       int device, int32_t transpose_w, AllToAllShape* shape) {
  FO_RETURN_IF_ERROR(CheckCommunicator(kOp, comm, world_size, comm_id, device));
  // ncclSend from a registered window hung on 2 x H200 (communicator.h): never on one.
  FO_CHECK_ARG(comm->peer_to_peer,
               kOp << ": comm_id " << comm_id << " names a collective communicator; the "
                      "all-to-all runs on a point-to-point one (comm.ensure_communicators("
                      "peer_to_peer=True))");
  FO_CHECK_ARG((split == 0 || split == 1) && (concat == 0 || concat == 1),
               kOp << ": split_axis and concat_axis must be 0 or 1, got " << split << " and "
                   << concat);
  FO_RETURN_IF_ERROR(CheckGemmOperands(kOp, x, w, out, transpose_w));
  const int64_t m = x.dimensions()[0], n = GemmN(w, transpose_w);
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
  *shape = {m, n, world, rows, cols, split, concat};
  return ffi::Error::Success();
}

ffi::Error GemmAllToAllImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                            ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int64_t comm_id,
                            int32_t world_size, int32_t comm_sms, int32_t transpose_w,
                            int32_t poison_outputs, int32_t split_axis,
                            int32_t concat_axis, ffi::Span<const int32_t> band_rows) {
  Communicator* comm = FindCommunicator(comm_id, device);
  AllToAllShape s;
  FO_RETURN_IF_ERROR(ValidateA2a(comm, x, w, *out, world_size, split_axis, concat_axis,
                                 band_rows, comm_id, device, transpose_w, &s));
  FO_RETURN_IF_ERROR(CheckCommSms(kOp, comm, comm_sms));
  FO_RETURN_IF_ERROR(PoisonResults(kOp, poison_outputs, stream, {&*out}));
  const int groups = static_cast<int>(band_rows.size()) - 1;
  // out: the workspace, taken by the call under its lock.
  SignalingGemmArgs gemm =
      GemmArgs(x.untyped_data(), s.m, w, transpose_w, nullptr, /*counters=*/nullptr, comm_sms);
  gemm.layout.num_blocks = s.split == 0 ? static_cast<int>(s.world) : 1;
  gemm.layout.num_groups = groups;
  for (int g = 0; g <= groups; ++g) gemm.layout.band_rows[g] = band_rows[g];
  gemm.out_col_block = s.split == 1 ? static_cast<int>(s.cols) : 0;
  return ToFfiError(RunGemmAllToAll(*comm, stream, s, gemm, out->untyped_data(),
                                    /*poison_workspace=*/poison_outputs == 1, kOp));
}

auto BindGemmAllToAll() {
  return BindOverlapCall()
      .Attr<int32_t>("split_axis")
      .Attr<int32_t>("concat_axis")
      .Attr<ffi::Span<const int32_t>>("band_rows");
}

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapGemmAllToAll,
                              flashoverlap::NoThrow(flashoverlap::kOp, flashoverlap::GemmAllToAllImpl),
                              flashoverlap::BindGemmAllToAll());
