// Does a device-to-device copy run while every SM is busy? The all-reduce copies each reduced
// group from the workspace to XLA's output on a copy stream beside the GEMM and NCCL; if the
// driver runs that copy as a kernel, it competes with NCCL for the few SMs the GEMM leaves
// free. This probe keeps SMs busy with a spinning kernel (one block per SM: most of the shared
// memory) and times a 64 MB copy on another stream, once as cudaMemcpyAsync and once as
// cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute (CUDA >= 12.8: a hint to
// use the copy engines). Prints when each copy ended, relative to the spinner's start.
//
// The spinner above leaves room on each SM for a copy kernel's blocks (its registers and
// threads are few), so it cannot tell a copy engine from a small kernel. The second probe
// (FullProbe) holds every SM's 2048 thread slots (two 1024-thread blocks per SM, as the
// signaling GEMM holds every register) until a flag arrives that is written after the copy
// (an H2D copy from pinned memory: a DMA), or 1 s passes: a copy that needs an SM cannot run
// until the spinner gives up.
//
//   nvcc -O2 -arch=sm_90a -o copy_engine_probe copy_engine_probe.cu && ./copy_engine_probe
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t err_ = (x);                                                       \
    if (err_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(err_));     \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__device__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins for `ns` nanoseconds; its shared memory keeps every other block off the SM.
__global__ void Spin(unsigned long long ns, int* sink) {
  extern __shared__ int smem[];
  const unsigned long long end = GlobalTimer() + ns;
  int acc = 0;
  while (GlobalTimer() < end) acc += smem[threadIdx.x % 32];
  if (acc == 12345) *sink = acc;
}

enum class Copy { kMemcpyAsync, kBatchPreferOverlap };

const char* Name(Copy c) {
  return c == Copy::kMemcpyAsync ? "cudaMemcpyAsync" : "cudaMemcpyBatchAsync(overlap hint)";
}

void Enqueue(Copy how, void* dst, void* src, size_t bytes, cudaStream_t s) {
  if (how == Copy::kMemcpyAsync) {
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    return;
  }
  cudaMemcpyAttributes attr = {};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
  void* dsts[1] = {dst};
  const void* srcs[1] = {src};
  size_t sizes[1] = {bytes};
  CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, &attr_index, 1, s));
}

// ms from the spinner's start to the copy's end (spinner on `busy_sms` SMs, 4 ms), and the
// copy alone.
void Probe(Copy how, int sms, int busy_sms, void* dst, void* src, size_t bytes, int* sink,
           size_t smem) {
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, e2, e3;
  for (cudaEvent_t* e : {&e0, &e1, &e2, &e3}) CHECK(cudaEventCreate(e));
  // Alone (warm).
  for (int i = 0; i < 2; ++i) Enqueue(how, dst, src, bytes, b);
  CHECK(cudaEventRecord(e0, b));
  Enqueue(how, dst, src, bytes, b);
  CHECK(cudaEventRecord(e1, b));
  CHECK(cudaStreamSynchronize(b));
  float alone = 0;
  CHECK(cudaEventElapsedTime(&alone, e0, e1));
  // Beside the spinner.
  CHECK(cudaEventRecord(e2, a));
  Spin<<<busy_sms, 128, smem, a>>>(4000000ull, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamWaitEvent(b, e2, 0));
  Enqueue(how, dst, src, bytes, b);
  CHECK(cudaEventRecord(e3, b));
  CHECK(cudaDeviceSynchronize());
  float beside = 0;
  CHECK(cudaEventElapsedTime(&beside, e2, e3));
  std::printf("%-36s  %3d of %d SMs busy 4 ms: copy ended at %7.3f ms (alone %.3f ms, %.0f GB/s)\n",
              Name(how), busy_sms, sms, beside, alone, bytes / alone / 1e6);
  for (cudaEvent_t e : {e0, e1, e2, e3}) CHECK(cudaEventDestroy(e));
  CHECK(cudaStreamDestroy(a));
  CHECK(cudaStreamDestroy(b));
}

// Two 1024-thread blocks per SM: no thread slot left. Waits for *flag (or 1 s); block 0
// records in result[0] the ns it waited, result[1] = 1 if it gave up.
__global__ void __launch_bounds__(1024) HoldAllThreads(const volatile int* flag, unsigned long long* result) {
  if (threadIdx.x == 0) {
    const unsigned long long t0 = GlobalTimer();
    bool gave_up = false;
    while (*flag == 0) {
      if (GlobalTimer() - t0 > 1000000000ull) { gave_up = true; break; }
    }
    if (blockIdx.x == 0) {
      result[0] = GlobalTimer() - t0;
      result[1] = gave_up;
    }
  }
  __syncthreads();
}

void FullProbe(Copy how, int sms, void* dst, void* src, size_t bytes) {
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  int *flag, *one;
  unsigned long long* result;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&result, 2 * sizeof(unsigned long long)));
  CHECK(cudaMallocHost(&one, sizeof(int)));
  *one = 1;
  CHECK(cudaMemset(flag, 0, sizeof(int)));
  CHECK(cudaDeviceSynchronize());
  HoldAllThreads<<<2 * sms, 1024, 0, a>>>(flag, result);
  CHECK(cudaGetLastError());
  Enqueue(how, dst, src, bytes, b);
  CHECK(cudaMemcpyAsync(flag, one, sizeof(int), cudaMemcpyHostToDevice, b));
  CHECK(cudaDeviceSynchronize());
  unsigned long long h[2];
  CHECK(cudaMemcpy(h, result, sizeof h, cudaMemcpyDeviceToHost));
  std::printf("%-36s  every thread slot of %d SMs held: %s after %.3f ms\n", Name(how), sms,
              h[1] ? "copy BLOCKED (the spinner gave up)" : "copy and flag arrived", h[0] / 1e6);
  CHECK(cudaFree(flag));
  CHECK(cudaFree(result));
  CHECK(cudaFreeHost(one));
  CHECK(cudaStreamDestroy(a));
  CHECK(cudaStreamDestroy(b));
}

int main() {
  int sms = 0, smem_max = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const size_t smem = static_cast<size_t>(smem_max) - 1024;
  CHECK(cudaFuncSetAttribute(Spin, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  const size_t bytes = 64ull << 20;
  void *src, *dst;
  int* sink;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  CHECK(cudaMemset(src, 1, bytes));
  for (Copy how : {Copy::kMemcpyAsync, Copy::kBatchPreferOverlap}) {
    for (int busy : {sms, sms - 8, sms - 16}) Probe(how, sms, busy, dst, src, bytes, sink, smem);
  }
  for (Copy how : {Copy::kMemcpyAsync, Copy::kBatchPreferOverlap}) FullProbe(how, sms, dst, src, bytes);
  return 0;
}
