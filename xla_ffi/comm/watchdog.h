// Optional watchdog of the overlapped calls (JAX_FLASHOVERLAP_WATCHDOG_S, default off).
//
// A call that waits on another rank can hang the whole job (a peer failed or runs another
// program). With the watchdog on, every call of a communicator is watched:
//   * the comm stream waits for the GEMM's counters with the spin kernel, which also reads
//     the communicator's abort flag (host-mapped memory), and a check kernel runs after the
//     call's last NCCL operation;
//   * the call's start and end are events on the comm stream, registered with one
//     background thread (started when the first watched communicator is made);
//   * the timeout counts from when the start event completes (the GPU reached the call), not
//     from when the handler enqueued it: JAX enqueues whole programs and dispatches later
//     steps ahead, so a call may wait behind seconds of earlier work without anything hanging;
//   * when the end has not completed after the timeout, that thread prints which op,
//     device and rank hung and for how long, sets the abort flag (the spin / check kernels
//     then trap: the XLA program fails with a CUDA error instead of returning wrong data),
//     and calls ncclCommAbort so NCCL's kernels stop waiting for the peer. A CUDA context
//     that trapped is unusable: the message says the process must restart, and later calls
//     on that communicator fail at once with an error naming the abort.
//   * if the stream still has not moved `kExitGraceSeconds` after the abort (NCCL's kernel
//     did not stop: seen on 2 x H200 with NCCL 2.28's symmetric kernels), the process exits
//     with status 134 and a message, rather than hang silently.
// Off, none of this runs and calls cost nothing extra.
#pragma once

#include <cuda_runtime.h>

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

struct Communicator;

constexpr double kExitGraceSeconds = 10.0;

// Allocates the abort flag of `comm` when comm.watchdog_seconds > 0 (creation time).
Status InitWatchdog(Communicator& comm);
// Stops watching its calls (destruction time); the flag's page is kept (watchdog.cc).
Status FreeWatchdog(Communicator& comm);

// At the start of a call: an error if the watchdog has aborted this communicator.
Status CheckNotAborted(const Communicator& comm, const char* op);

// Where the call's work begins on comm.stream (StartCall): records its start event, kept in
// comm.watch_started until WatchCall. No-op when the watchdog is off. Under comm.call_mutex.
Status WatchStart(Communicator& comm);

// At the end of a call, after its last operation on comm.stream: enqueues the check
// kernel and registers the call (its start and end) with the watchdog thread. No-op when
// the watchdog is off.
Status WatchCall(Communicator& comm, const char* op);

// A call that failed before WatchCall: its start event goes back to the spares.
void WatchAbandon(Communicator& comm);

// Host side: the flag is set by the watchdog's and the aborts' threads and read by the admin
// ones (quiesce, destroy): atomic accesses (a plain volatile one across threads is a data
// race). The device reads it as volatile (host-mapped memory).
inline void RaiseAbortFlag(volatile int* flag) {
  if (flag != nullptr) __atomic_store_n(const_cast<int*>(flag), 1, __ATOMIC_SEQ_CST);
}
inline bool AbortFlagRaised(const volatile int* flag) {
  return flag != nullptr && __atomic_load_n(const_cast<const int*>(flag), __ATOMIC_SEQ_CST) != 0;
}
// Aborted, or being aborted (the flag is raised first, then the call mutex awaited).
bool IsAborted(const Communicator* c);

// Device side (watchdog_kernel.cu): traps when *abort_flag != 0.
cudaError_t LaunchAbortCheck(cudaStream_t stream, const volatile int* abort_flag);
// Loads it on the current device now (as LoadSpinWaitKernel, stream_wait.h).
cudaError_t LoadAbortCheckKernel();

}  // namespace flashoverlap
