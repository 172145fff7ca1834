// The watchdog's check kernel: after a watched call's last NCCL operation, fail the stream
// (trap) if the watchdog aborted the communicator, so XLA reports an error instead of
// handing back the output of a collective that never completed.
#include <cuda_runtime.h>

#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

__global__ void AbortCheckKernel(const volatile int* abort_flag) {
  if (*abort_flag != 0) __trap();
}

}  // namespace

cudaError_t LaunchAbortCheck(cudaStream_t stream, const volatile int* abort_flag) {
  AbortCheckKernel<<<1, 1, 0, stream>>>(abort_flag);
  return cudaGetLastError();
}

}  // namespace flashoverlap
