// One-thread kernel that spins until a counter reaches a value: the fallback wait when
// stream memory operations are unavailable. It occupies one SM slot while it spins.
#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/stream_wait.h"

namespace flashoverlap {
namespace {

// "Reached" is cyclic, as cuStreamWaitValue32's GEQ: (int32)(seen - value) >= 0. The peer
// stores' call numbers count every call of a communicator and wrap past 2^31: a plain
// `seen < value` let every wait of the call after the wrap pass at once (wrong data).
__device__ __forceinline__ bool Before(int32_t seen, int32_t value) {
  return static_cast<int32_t>(static_cast<uint32_t>(seen) - static_cast<uint32_t>(value)) < 0;
}

__global__ void SpinWaitGeqKernel(const int32_t* counter, int32_t value,
                                  const volatile int* abort_flag) {
  int32_t seen;
  do {
    // The watchdog gave up on this call: fail loudly rather than run NCCL on a dead comm.
    if (abort_flag != nullptr && *abort_flag != 0) __trap();
    // Acquire at system scope: the word's writer may be another GPU (the peer stores' credit
    // and done words), whose stores before it must be visible to whatever this stream runs
    // next; for our own GEMM's counters (its tile stores fenced before its atomicAdd) GPU
    // scope would do (a system-scope load per spin; the spin sleeps 200 ns between loads).
    asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (Before(seen, value)) __nanosleep(200);
  } while (Before(seen, value));
}

}  // namespace

cudaError_t LaunchSpinWaitGeq(cudaStream_t stream, const int32_t* counter, int32_t value,
                              const volatile int* abort_flag) {
  // cudaLaunchKernel returns this launch's own error; `<<<>>>` + cudaGetLastError() would
  // also return an earlier failed call's error left on this thread, failing a call that
  // launched fine after its GEMM went out (its peers would then wait for it).
  void* args[] = {&counter, &value, &abort_flag};
  return cudaLaunchKernel(SpinWaitGeqKernel, dim3(1), dim3(1), args, 0, stream);
}

cudaError_t LoadSpinWaitKernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, SpinWaitGeqKernel);
}

}  // namespace flashoverlap
