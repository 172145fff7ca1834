// What every handler that runs NCCL on our communicators does the same way before handing
// the call to the framework-free layer (xla_ffi/comm/overlap_calls.h): its binding's common
// part, the communicator / workspace checks (the operands': gemm_operands.h), and the error
// coming back as ffi::Error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
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
// poison_outputs (0 / 1): PoisonCall before the call (poison.h).
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

// With poison_outputs, fills XLA's results (null entries skipped) and the communicator's
// workspace with NaN on the compute stream before the call: the call orders our streams after
// it (StartCall), so an unwritten element of a result, or a GEMM tile that read rows before
// they arrived in the workspace, shows as NaN.
inline ffi::Error PoisonCall(const char* op, int32_t poison_outputs, cudaStream_t stream,
                             const Communicator& comm,
                             std::initializer_list<const ffi::AnyBuffer*> results) {
  FO_RETURN_IF_ERROR(PoisonResults(op, poison_outputs, stream, results));
  if (poison_outputs == 0) return ffi::Error::Success();
  return PoisonBytes(comm.workspace, comm.workspace_bytes, stream);
}

// The communicator's workspace (sized at lowering) holds what this call needs.
inline ffi::Error CheckWorkspace(const char* op, const Communicator& comm, size_t bytes) {
  FO_CHECK_ARG(comm.workspace_bytes >= bytes || comm.workspace_error.empty(),
               op << ": no communication workspace on device " << comm.device
                  << ": allocating it when the op was lowered failed (" << comm.workspace_error
                  << "); free device memory (XLA_PYTHON_CLIENT_MEM_FRACTION) and lower again");
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
