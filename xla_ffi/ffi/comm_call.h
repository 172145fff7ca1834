// What every handler that runs NCCL on our communicators does the same way: find-and-check the
// communicator, and finish the call (watchdog registration, joining our streams back to XLA's
// stream even after an error, the error as ffi::Error naming the op).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/watchdog.h"
#include "xla_ffi/ffi/check.h"

namespace flashoverlap {

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

// Under the communicator's call mutex: an error naming the op if the watchdog aborted it.
inline ffi::Error CheckAlive(const char* op, const Communicator& comm) {
  Status alive = CheckNotAborted(comm, op);  // its message names the op already
  if (!alive.ok()) return ffi::Error::Internal(alive.message);
  return ffi::Error::Success();
}

// Ends a call: watches it (watchdog on), then makes XLA's stream wait for our comm stream
// (and the copy stream when `copies`) whatever `status` says, so XLA never runs ahead of
// queued work and the next call never overwrites a span still in flight.
inline ffi::Error FinishCall(const char* op, Communicator& comm, cudaStream_t stream,
                             bool copies, Status status) {
  if (status.ok()) status = WatchCall(comm, op);
  FO_CHECK_CUDA(cudaEventRecord(comm.comm_done, comm.stream));
  FO_CHECK_CUDA(cudaStreamWaitEvent(stream, comm.comm_done, 0));
  if (copies) {
    FO_CHECK_CUDA(cudaEventRecord(comm.copies_done, comm.copy_stream));
    FO_CHECK_CUDA(cudaStreamWaitEvent(stream, comm.copies_done, 0));
  }
  if (!status.ok()) return ffi::Error::Internal(std::string(op) + ": " + status.message);
  return ffi::Error::Success();
}

}  // namespace flashoverlap
