// What every handler that runs NCCL on our communicators does the same way before handing
// the call to the framework-free layer (xla_ffi/comm/overlap_calls.h): its binding's common
// part, the operand / communicator / workspace checks, the GEMM's arguments, and the error
// coming back as ffi::Error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// Stream, device, x, w, the result, and the attributes every overlapped op takes; each handler
// appends its own attributes. transpose_w (0 / 1): w is [N, K] and the product x @ w^T.
inline auto BindOverlapCall() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::DeviceOrdinal>()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Attr<int64_t>("comm_id")
      .Attr<int32_t>("world_size")
      .Attr<int32_t>("comm_sms")
      .Attr<int32_t>("transpose_w");
}

// N of x @ w: w is [K, N], or [N, K] with transpose_w.
inline int64_t GemmN(const ffi::AnyBuffer& w, int32_t transpose_w) {
  return w.dimensions()[transpose_w ? 0 : 1];
}

// x [M, K] @ w [K, N] (or w [N, K] with transpose_w) -> out: bfloat16 or float16 throughout,
// 2-D, N and K multiples of 8 (the output's shape is each op's own check).
inline ffi::Error CheckGemmOperands(const char* op, const ffi::AnyBuffer& x,
                                    const ffi::AnyBuffer& w, const ffi::AnyBuffer& out,
                                    int32_t transpose_w) {
  FO_CHECK_ARG(transpose_w == 0 || transpose_w == 1,
               op << ": transpose_w must be 0 or 1, got " << transpose_w);
  auto dtype = x.element_type();
  FO_CHECK_ARG(dtype == ffi::DataType::BF16 || dtype == ffi::DataType::F16,
               op << ": x must be bfloat16 or float16");
  FO_CHECK_ARG(w.element_type() == dtype && out.element_type() == dtype,
               op << ": x, w and the output must share one dtype");
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  FO_CHECK_ARG(xd.size() == 2 && wd.size() == 2 && out.dimensions().size() == 2,
               op << ": x, w and the output must be 2-D");
  const int64_t m = xd[0], k = xd[1], n = GemmN(w, transpose_w);
  FO_CHECK_ARG(wd[transpose_w ? 1 : 0] == k,
               op << ": x is [" << m << ", " << k << "] but w is [" << wd[0] << ", " << wd[1]
                  << "] (expected " << (transpose_w ? "[N, K]" : "[K, N]") << ")");
  FO_CHECK_ARG(n % 8 == 0 && k % 8 == 0, op << ": N and K must be multiples of 8");
  return ffi::Error::Success();
}

// The signaling GEMM of a call: x [m, K] (row-major, where the op keeps it) @ w -> out, in w's
// dtype, signalling into `counters` (null: no signal); the group layout is each op's own.
inline SignalingGemmArgs GemmArgs(const void* x, int64_t m, const ffi::AnyBuffer& w,
                                  int32_t transpose_w, void* out, int32_t* counters,
                                  int comm_sms) {
  SignalingGemmArgs args;
  args.x = x;
  args.w = w.untyped_data();
  args.transpose_w = transpose_w != 0;
  args.out = out;
  args.m = m;
  args.k = w.dimensions()[transpose_w ? 1 : 0];
  args.n = GemmN(w, transpose_w);
  args.dtype = w.element_type() == ffi::DataType::BF16 ? GemmDType::kBFloat16
                                                       : GemmDType::kFloat16;
  args.counters = counters;
  args.comm_sms = comm_sms;
  return args;
}

// The communicator's workspace (sized at lowering) holds what this call needs.
inline ffi::Error CheckWorkspace(const char* op, const Communicator& comm, size_t bytes) {
  FO_CHECK_ARG(comm.workspace_bytes >= bytes,
               op << ": communication workspace has " << comm.workspace_bytes << " bytes, needs "
                  << bytes << " (jax_flashoverlap.comm.ensure_communicators sizes it at lowering)");
  return ffi::Error::Success();
}

// The communicator exists on this device and was made for the program's world size.
inline ffi::Error CheckCommunicator(const char* op, const Communicator* comm, int32_t world_size,
                                    int64_t comm_id, int device) {
  FO_CHECK_ARG(comm != nullptr,
               op << ": no communicator for comm_id " << comm_id << " on device " << device
                  << "; communicators are created when the op is lowered for a local GPU mesh "
                     "(jax_flashoverlap.comm.ensure_communicators)");
  FO_CHECK_ARG(comm->world_size == world_size,
               op << ": program was built for " << world_size << " ranks, communicator has "
                  << comm->world_size);
  return ffi::Error::Success();
}

// A failed Status of the framework-free layer (its message names the op) as ffi::Error.
inline ffi::Error ToFfiError(const Status& status) {
  if (status.ok()) return ffi::Error::Success();
  return ffi::Error::Internal(status.message);
}

}  // namespace flashoverlap
