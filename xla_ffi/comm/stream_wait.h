// Makes a stream wait until a device int32 counter reaches a value, without an SM when
// possible: cuStreamWaitValue32 (driver API, reached through the runtime's entry-point
// query so nothing links libcuda), or a one-thread spin kernel as the fallback.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

enum class WaitMethod : int { kStreamOp = 0, kSpinKernel = 1 };

// JAX_FLASHOVERLAP_WAIT: unset or empty (stream memory operations) or "spin" (*spin); any
// other value is an error naming the variable (a typo must not silently keep the default).
// Checked when communicators are made (CreateCommunicators).
Status ReadWaitEnv(bool* spin);

// Method from JAX_FLASHOVERLAP_WAIT (ReadWaitEnv; stream operations unless "spin");
// kSpinKernel when the driver entry point or the device attribute is missing.
WaitMethod ChosenWaitMethod(int device);

// Enqueues on `stream`: wait until *counter >= value, cyclically ((int32)(*counter - value)
// >= 0, as cuStreamWaitValue32's GEQ; the spin kernel compares the same way), so call
// numbers may wrap. With the spin kernel, a non-null
// `abort_flag` (the watchdog's, host-mapped) that becomes non-zero makes the wait trap.
Status EnqueueWaitGeq(cudaStream_t stream, const int32_t* counter, int32_t value,
                      WaitMethod method, const volatile int* abort_flag = nullptr);

// Waits on the host, at most `seconds`, until every (device, stream) has finished its work
// (cudaStreamQuery polled every millisecond, each stream's device current while asked; the
// caller's device restored). `*timed_out`: the time ran out with work left, which is then
// Ok (the caller decides); a stream's own error is returned. Unlike cudaStreamSynchronize it
// ends when a collective's other ranks never come.
Status WaitStreamsIdle(const std::vector<std::pair<int, cudaStream_t>>& streams, double seconds,
                       bool* timed_out);

// The spin kernel's launcher (stream_wait_kernel.cu).
cudaError_t LaunchSpinWaitGeq(cudaStream_t stream, const int32_t* counter, int32_t value,
                              const volatile int* abort_flag);

// Loads the spin kernel on the current device now (cudaFuncGetAttributes) instead of at its
// first launch: under CUDA's lazy loading that load waits for the kernels running then, the
// call's own GEMM, so the first call's waits began only after it (communicator.cc).
cudaError_t LoadSpinWaitKernel();

}  // namespace flashoverlap
