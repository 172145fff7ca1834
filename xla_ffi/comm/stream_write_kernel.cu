// One-thread kernel that sets a flag: the fallback of EnqueueWriteFlag when stream memory
// operations are unavailable. Everything before it on the stream has completed; the
// system-scope fence and release store publish those writes with the flag.
#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/stream_write.h"

namespace flashoverlap {
namespace {

__global__ void WriteFlagKernel(int32_t* flag, int32_t value) {
  __threadfence_system();
  asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

}  // namespace

cudaError_t LaunchWriteFlagKernel(cudaStream_t stream, int32_t* flag, int32_t value) {
  void* args[] = {&flag, &value};  // cudaLaunchKernel: this launch's own error (stream_wait_kernel.cu)
  return cudaLaunchKernel(WriteFlagKernel, dim3(1), dim3(1), args, 0, stream);
}

cudaError_t LoadWriteFlagKernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, WriteFlagKernel);
}

}  // namespace flashoverlap
