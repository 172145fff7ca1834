#include "xla_ffi/comm/driver_entry.h"

#include <cuda_runtime.h>

namespace flashoverlap {

void* DriverEntryPoint(const char* name) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &found);
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &ptr, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // clear: the caller's fallback is fine
    return nullptr;
  }
  return ptr;
}

}  // namespace flashoverlap
