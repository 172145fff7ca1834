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
  void* args[] = {&abort_flag};  // cudaLaunchKernel: this launch's own error (stream_wait_kernel.cu)
  return cudaLaunchKernel(AbortCheckKernel, dim3(1), dim3(1), args, 0, stream);
}

cudaError_t LoadAbortCheckKernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, AbortCheckKernel);
}

}  // namespace flashoverlap
