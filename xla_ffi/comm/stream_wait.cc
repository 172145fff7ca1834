#include "xla_ffi/comm/stream_wait.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "xla_ffi/comm/driver_entry.h"

namespace flashoverlap {
namespace {

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// Resolved once per process; null when the driver does not offer it.
WaitValue32Fn WaitValue32() {
  static WaitValue32Fn fn = reinterpret_cast<WaitValue32Fn>(DriverEntryPoint("cuStreamWaitValue32"));
  return fn;
}

}  // namespace

WaitMethod ChosenWaitMethod(int device) {
  const char* env = std::getenv("JAX_FLASHOVERLAP_WAIT");
  if (env != nullptr && std::strcmp(env, "spin") == 0) return WaitMethod::kSpinKernel;
  if (WaitValue32() == nullptr) return WaitMethod::kSpinKernel;
  // Stream memory operations are always enabled since CUDA 12 (the device attribute that
  // gated them is deprecated); seen working on H200 (DESIGN.md, "Communicators").
  (void)device;
  return WaitMethod::kStreamOp;
}

Status EnqueueWaitGeq(cudaStream_t stream, const int32_t* counter, int32_t value,
                      WaitMethod method, const volatile int* abort_flag) {
  if (method == WaitMethod::kStreamOp) {
    CUresult res = WaitValue32()(reinterpret_cast<CUstream>(stream),
                                 reinterpret_cast<CUdeviceptr>(counter),
                                 static_cast<cuuint32_t>(value), CU_STREAM_WAIT_VALUE_GEQ);
    if (res != CUDA_SUCCESS) {
      return Status::Error("cuStreamWaitValue32 failed with CUresult " + std::to_string(res));
    }
    return Status::Ok();
  }
  FO_RETURN_IF_CUDA(LaunchSpinWaitGeq(stream, counter, value, abort_flag));
  return Status::Ok();
}

}  // namespace flashoverlap
