// Sets a device int32 flag from a stream once the work queued before it is done (the
// all-gather + GEMM's "chunk arrived" signal): cuStreamWriteValue32 with its default memory
// barrier (driver API, reached through the runtime's entry-point query, as stream_wait.cc
// does for the wait), or a one-thread kernel (system fence, release store) as the fallback.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// Enqueues on `stream`: *flag = value, after (and ordered after the memory effects of)
// everything queued on `stream` before it. Uses the kernel when JAX_FLASHOVERLAP_WAIT=spin
// or when the driver lacks cuStreamWriteValue32.
Status EnqueueWriteFlag(cudaStream_t stream, int32_t* flag, int32_t value);

// The fallback kernel's launcher (stream_write_kernel.cu).
cudaError_t LaunchWriteFlagKernel(cudaStream_t stream, int32_t* flag, int32_t value);

// Loads the kernel on the current device now (as LoadSpinWaitKernel, stream_wait.h).
cudaError_t LoadWriteFlagKernel();

}  // namespace flashoverlap
