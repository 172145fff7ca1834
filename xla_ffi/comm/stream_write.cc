#include "xla_ffi/comm/stream_write.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "xla_ffi/comm/driver_entry.h"
#include "xla_ffi/comm/stream_wait.h"

namespace flashoverlap {
namespace {

using WriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// Resolved once per process; null when the driver does not offer it.
WriteValue32Fn WriteValue32() {
  static WriteValue32Fn fn = reinterpret_cast<WriteValue32Fn>(DriverEntryPoint("cuStreamWriteValue32"));
  return fn;
}

}  // namespace

WriteMethod ChosenWriteMethod() {
  bool spin = false;
  if (ReadWaitEnv(&spin).ok() && spin) return WriteMethod::kKernel;
  return WriteValue32() == nullptr ? WriteMethod::kKernel : WriteMethod::kStreamOp;
}

Status EnqueueWriteFlag(cudaStream_t stream, int32_t* flag, int32_t value, WriteMethod method) {
  if (method == WriteMethod::kKernel || WriteValue32() == nullptr) {
    FO_RETURN_IF_CUDA(LaunchWriteFlagKernel(stream, flag, value));
    return Status::Ok();
  }
  // Flags 0: the write is preceded by a memory barrier (the data the flag announces is
  // visible before the flag is).
  CUresult res = WriteValue32()(reinterpret_cast<CUstream>(stream),
                                reinterpret_cast<CUdeviceptr>(flag),
                                static_cast<cuuint32_t>(value), 0);
  if (res != CUDA_SUCCESS) {
    return Status::Error("cuStreamWriteValue32 failed with CUresult " + std::to_string(res));
  }
  return Status::Ok();
}

}  // namespace flashoverlap
