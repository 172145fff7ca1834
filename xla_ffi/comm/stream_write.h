// Sets a device int32 flag from a stream once the work queued before it is done (the
// all-gather + GEMM's "chunk arrived" signal): cuStreamWriteValue32 with its default memory
// barrier (driver API, reached through the runtime's entry-point query, as stream_wait.cc
// does for the wait), or a one-thread kernel (system fence, release store) as the fallback.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// How a flag is written: a stream memory operation or the one-thread kernel.
enum class WriteMethod : int { kStreamOp = 0, kKernel = 1 };

// The kernel when JAX_FLASHOVERLAP_WAIT=spin (an unknown value counts as unset here: creation
// refuses it, ReadWaitEnv) or when the driver lacks cuStreamWriteValue32. Chosen once, when a
// communicator is made, like its wait method: a switch changed later does not reach its calls.
WriteMethod ChosenWriteMethod();

// Enqueues on `stream`: *flag = value, after (and ordered after the memory effects of)
// everything queued on `stream` before it, by `method` (kStreamOp falls back to the kernel
// when the driver lacks the stream operation).
Status EnqueueWriteFlag(cudaStream_t stream, int32_t* flag, int32_t value, WriteMethod method);

// The fallback kernel's launcher (stream_write_kernel.cu).
cudaError_t LaunchWriteFlagKernel(cudaStream_t stream, int32_t* flag, int32_t value);

// Loads the kernel on the current device now (as LoadSpinWaitKernel, stream_wait.h).
cudaError_t LoadWriteFlagKernel();

}  // namespace flashoverlap
