// What every handler that runs NCCL on our communicators does the same way before handing
// the call to the framework-free layer (xla_ffi/comm/overlap_calls.h): its binding's common
// part, the communicator check (the operands': gemm_operands.h), and the error coming back
// as ffi::Error. The workspace is the call's to check, under the communicator's call mutex
// (UseWorkspace, call_frame.h): a workspace growth on another thread may swap it until then.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/gemm_operands.h"
#include "xla_ffi/ffi/poison.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// Stream, device, x, w, the result, and the attributes every overlapped op takes; each handler
// appends its own attributes. transpose_w (0 / 1): w is [N, K] and the product x @ w^T.
// poison_outputs (0 / 1): PoisonResults before the call (poison.h), the workspace by the call.
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
      .Attr<int32_t>("transpose_w")
      .Attr<int32_t>("poison_outputs");
}

// The communicator exists on this device and was made for the program's world size.
inline ffi::Error CheckCommunicator(const char* op, const Communicator* comm, int32_t world_size,
                                    int64_t comm_id, int device) {
  FO_CHECK_ARG(comm != nullptr,
               op << ": no communicator for comm_id " << comm_id << " on device " << device
                  << "; communicators are created when the op is lowered in this process for a "
                     "local GPU mesh (jax_flashoverlap.comm.ensure_communicators), so a program "
                     "loaded from a serialized executable (jax.experimental.serialize_executable) "
                     "or kept across comm.destroy_communicators() has none: lower the same "
                     "function in this process first (jax.jit(f).lower(...); after "
                     "destroy_communicators(), jax.clear_caches() before it, since JAX gives "
                     "back the function's cached lowering, which makes none)");
  FO_CHECK_ARG(comm->world_size == world_size,
               op << ": program was built for " << world_size << " ranks, communicator has "
                  << comm->world_size);
  return ffi::Error::Success();
}

// The GEMM leaves free the SMs the communicator's NCCL kernels are capped to (comm_id names
// both; a hand-built call could still split them).
inline ffi::Error CheckCommSms(const char* op, const Communicator* comm, int32_t comm_sms) {
  FO_CHECK_ARG(comm_sms == comm->comm_sms,
               op << ": comm_sms " << comm_sms << " differs from the communicator's CTA cap "
                  << comm->comm_sms << " (comm_id " << comm->comm_id << ")");
  return ffi::Error::Success();
}

// A failed Status of the framework-free layer (its message names the op) as ffi::Error.
inline ffi::Error ToFfiError(const Status& status) {
  if (status.ok()) return ffi::Error::Success();
  return ffi::Error::Internal(status.message);
}

}  // namespace flashoverlap
