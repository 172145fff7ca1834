#include "xla_ffi/comm/stream_wait.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

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

Status ReadWaitEnv(bool* spin) {
  const char* env = std::getenv("JAX_FLASHOVERLAP_WAIT");
  *spin = env != nullptr && std::strcmp(env, "spin") == 0;
  if (env == nullptr || *env == '\0' || *spin) return Status::Ok();
  return Status::Error(std::string("JAX_FLASHOVERLAP_WAIT='") + env +
                       "' must be 'spin' (spin-kernel waits and flag writes) or unset");
}

WaitMethod ChosenWaitMethod(int device) {
  bool spin = false;
  if (ReadWaitEnv(&spin).ok() && spin) return WaitMethod::kSpinKernel;
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

Status WaitStreamsIdle(const std::vector<std::pair<int, cudaStream_t>>& streams, double seconds,
                       bool* timed_out) {
  *timed_out = false;
  int previous = 0;
  FO_RETURN_IF_CUDA(cudaGetDevice(&previous));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  Status status = Status::Ok();
  for (const auto& [device, stream] : streams) {
    status = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
    cudaError_t res = cudaErrorNotReady;
    while (status.ok() && (res = cudaStreamQuery(stream)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() >= deadline) {
        *timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (status.ok() && res != cudaSuccess && res != cudaErrorNotReady) {
      status = CudaStatus(res, "cudaStreamQuery");
    }
    if (!status.ok() || *timed_out) break;
  }
  Status back = CudaStatus(cudaSetDevice(previous), "cudaSetDevice");
  return status.ok() ? back : status;
}

}  // namespace flashoverlap
