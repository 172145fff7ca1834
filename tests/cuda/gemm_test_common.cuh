// Helpers of the standalone signaling-GEMM test (gemm_test.cu): cuBLAS through dlopen,
// random fill, an fp32 reference GEMM, error statistics, the signal watcher kernel, and
// group-layout helpers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <library_types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../../xla_ffi/kernels/signaling_gemm.h"
#include "round_order.h"

using namespace flashoverlap;

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
              #expr);                                                                         \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

// ---------------------------------------------------------------- cuBLAS via dlopen
typedef void* cublasHandle_t;
typedef int (*CreateFn)(cublasHandle_t*);
typedef int (*SetStreamFn)(cublasHandle_t, cudaStream_t);
typedef int (*GemmExFn)(cublasHandle_t, int, int, int, int, int, const void*, const void*, cudaDataType, int,
                        const void*, cudaDataType, int, const void*, void*, cudaDataType, int, int, int);
struct Cublas {
  cublasHandle_t h = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm = nullptr;
  bool ok() const { return gemm != nullptr; }
  void Load() {
    const char* env = getenv("CUBLAS_LIB");
    void* lib = dlopen(env ? env : "libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "cuBLAS not loaded: %s\n", dlerror()); return; }
    auto create = (CreateFn)dlsym(lib, "cublasCreate_v2");
    set_stream = (SetStreamFn)dlsym(lib, "cublasSetStream_v2");
    auto gemm_fn = (GemmExFn)dlsym(lib, "cublasGemmEx");
    if (!create || !set_stream || !gemm_fn || create(&h) != 0) { fprintf(stderr, "cuBLAS symbols missing\n"); return; }
    gemm = gemm_fn;
  }
  // Row-major out[M,N] = x[M,K] @ w[K,N]  ==  column-major out^T = w^T x^T.
  int Run(const void* x, const void* w, void* out, int M, int N, int K, GemmDType dt, cudaStream_t s) {
    const float one = 1.f, zero = 0.f;
    const cudaDataType t = dt == GemmDType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
    set_stream(h, s);
    return gemm(h, 0, 0, N, M, K, &one, w, t, N, x, t, K, &zero, out, t, N, /*COMPUTE_32F*/ 68,
                /*CUBLAS_GEMM_DEFAULT*/ -1);
  }
};

// ---------------------------------------------------------------- device helpers
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ __nv_bfloat16 FromF(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half FromF(float v) { return __float2half(v); }

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return uint32_t(x);
}
template <class T>
__global__ void FillRandom(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = FromF<T>(Hash(seed * 0x9E3779B97F4A7C15ULL + i) * (2.0f / 4294967296.0f) - 1.0f);
}

// fp32 reference, 64x64 tile per block, 4x4 per thread.
template <class T>
__global__ void RefGemm(const T* x, const T* w, float* ref, int M, int N, int K) {
  __shared__ float sx[16][65], sw[16][65];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int r = i / 16, c = i % 16;  // x tile: 64 rows x 16 k
      sx[c][r] = (m0 + r < M && k0 + c < K) ? ToF(x[int64_t(m0 + r) * K + k0 + c]) : 0.f;
      const int kr = i / 64, nc = i % 64;  // w tile: 16 k x 64 cols
      sw[kr][nc] = (k0 + kr < K && n0 + nc < N) ? ToF(w[int64_t(k0 + kr) * N + n0 + nc]) : 0.f;
    }
    __syncthreads();
    for (int kk = 0; kk < 16; ++kk)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += sx[kk][ty * 4 + i] * sw[kk][tx * 4 + j];
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int r = m0 + ty * 4 + i, c = n0 + tx * 4 + j;
      if (r < M && c < N) ref[int64_t(r) * N + c] = acc[i][j];
    }
}

// sum (out - ref)^2, sum ref^2 over logical rows; out row of logical row r is dst[r].
// Poisoned (0xFFFF) or non-finite outputs are counted separately.
template <class T>
__global__ void ErrorStats(const T* out, const float* ref, const int* dst, int64_t M, int64_t N, double* acc,
                           unsigned long long* bad) {
  double d2 = 0, r2 = 0;
  unsigned long long nbad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, c = i % N;
    const float o = ToF(out[int64_t(dst[r]) * N + c]);
    const float e = ref[i];
    if (!isfinite(o)) { ++nbad; continue; }
    d2 += double(o - e) * (o - e);
    r2 += double(e) * e;
  }
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    nbad += __shfl_down_sync(0xffffffffu, nbad, off);
  }
  if (threadIdx.x % 32 == 0) { atomicAdd(acc, d2); atomicAdd(acc + 1, r2); atomicAdd(bad, nbad); }
}

// Elements off the reference by more than tol_rel * |ref| + tol_abs (a missing or doubled
// K slice of one tile shows here even when the norm over the whole output barely moves).
template <class T>
__global__ void CountWrong(const T* out, const float* ref, const int* dst, int64_t M, int64_t N, float tol_rel,
                           float tol_abs, unsigned long long* wrong) {
  unsigned long long n = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, c = i % N;
    const float o = ToF(out[int64_t(dst[r]) * N + c]);
    const float e = ref[i];
    if (isfinite(o) && fabsf(o - e) > tol_rel * fabsf(e) + tol_abs) ++n;
  }
  for (int off = 16; off > 0; off /= 2) n += __shfl_down_sync(0xffffffffu, n, off);
  if (threadIdx.x % 32 == 0 && n) atomicAdd(wrong, n);
}

__device__ __forceinline__ int LoadAcquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// One block per group: wait (acquire) until the group's counter is complete, then check
// every element of the group's rows: never the poison pattern, and close to the fp32
// reference. Also records whether the last group was still incomplete at that moment,
// i.e. whether the check really ran while the GEMM was still writing.
struct WatchOut {
  unsigned long long unwritten, wrong;
  int timed_out, seen_early;
};
template <class T>
__global__ void Watcher(const int* counters, const int* expected, int num_groups, const int* group_row0,
                        const T* out, const float* ref, const int* src_of_dst, int N, WatchOut* res) {
  const int g = blockIdx.x;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    const uint64_t t0 = GlobalTimer();
    ok = 1;
    while (LoadAcquire(counters + g) < expected[g]) {
      if (GlobalTimer() - t0 > 10000000000ull) { ok = 0; atomicAdd(&res->timed_out, 1); break; }
    }
    if (ok && LoadAcquire(counters + num_groups - 1) < expected[num_groups - 1]) atomicAdd(&res->seen_early, 1);
  }
  __syncthreads();
  if (!ok) return;
  unsigned long long unwritten = 0, wrong = 0;
  const int64_t r0 = group_row0[g], r1 = group_row0[g + 1];
  const int64_t chunks = (r1 - r0) * N / 8;
  for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) {
    const int64_t e0 = r0 * N + i * 8;
    const int64_t row = e0 / N, col = e0 % N;
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(out + e0));  // L2, never a stale L1 line
    const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
    const float* rf = ref + int64_t(src_of_dst[row]) * N + col;
    for (int j = 0; j < 8; ++j) {
      if (h[j] == 0xFFFF) { ++unwritten; continue; }
      T v; memcpy(&v, h + j, 2);
      const float o = ToF(v), e = rf[j];
      if (!(fabsf(o - e) <= 0.02f * fabsf(e) + 0.5f)) ++wrong;
    }
  }
  if (unwritten) atomicAdd(&res->unwritten, unwritten);
  if (wrong) atomicAdd(&res->wrong, wrong);
}

// Holds one SM for `ns` (a late peer, a delayed writer).
__global__ void SleepNs(int64_t ns) {
  const uint64_t t0 = GlobalTimer();
  while (int64_t(GlobalTimer() - t0) < ns) __nanosleep(500);
}

// ---------------------------------------------------------------- host helpers
struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buf(size_t b) : bytes(b) { CK(cudaMalloc(&p, b < 16 ? 16 : b)); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
};

// GEMM_TEST_TRANSPOSE_W=1: every launch reads w as [N, K] (args.transpose_w, the K-major
// instances) from a transposed copy, while references stay x @ w [K, N]: each check of the
// test programs then covers the transposed-weight path unchanged.
bool TransposeWMode() {
  const char* v = getenv("GEMM_TEST_TRANSPOSE_W");
  return v != nullptr && *v != '\0' && strcmp(v, "0") != 0;
}
__global__ void Transpose16(const uint16_t* in, uint16_t* out, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    out[(i % cols) * rows + i / cols] = in[i];
}
// In that mode: a [N, K] copy of a.w, swapped into `a`; it lives as long as this object.
struct TransposedW {
  Buf wt;
  TransposedW(SignalingGemmArgs& a, cudaStream_t s) : wt(TransposeWMode() ? size_t(a.k * a.n * 2) : 16) {
    if (!TransposeWMode()) return;
    Transpose16<<<1024, 256, 0, s>>>((const uint16_t*)a.w, (uint16_t*)wt.p, a.k, a.n);
    CK(cudaGetLastError());
    a.w = wt.p;
    a.transpose_w = true;
  }
};

// The tile queue's workspace (signaling_gemm.h), one for the process: every launch here is
// on one stream, one at a time. FLASHOVERLAP_GEMM_QUEUE=static runs the round-robin order.
void* GemmQueue() {
  static void* q = nullptr;
  if (q == nullptr) CK(cudaMalloc(&q, kGemmQueueBytes));
  return q;
}

void Fill(void* p, int64_t n, GemmDType dt, uint64_t seed, cudaStream_t s) {
  if (dt == GemmDType::kBFloat16) FillRandom<<<1024, 256, 0, s>>>((__nv_bfloat16*)p, n, seed);
  else FillRandom<<<1024, 256, 0, s>>>((__half*)p, n, seed);
  CK(cudaGetLastError());
}
void Reference(const void* x, const void* w, float* ref, int M, int N, int K, GemmDType dt, cudaStream_t s) {
  dim3 grid((N + 63) / 64, (M + 63) / 64);
  if (dt == GemmDType::kBFloat16) RefGemm<<<grid, 256, 0, s>>>((const __nv_bfloat16*)x, (const __nv_bfloat16*)w, ref, M, N, K);
  else RefGemm<<<grid, 256, 0, s>>>((const __half*)x, (const __half*)w, ref, M, N, K);
  CK(cudaGetLastError());
}

// Layout with num_blocks rank blocks and bands at the given offsets inside a block.
GroupLayout MakeLayout(int64_t M, int num_blocks, std::vector<int> bands) {
  GroupLayout L;
  L.num_blocks = num_blocks;
  L.num_groups = int(bands.size()) - 1;
  for (size_t i = 0; i < bands.size(); ++i) L.band_rows[i] = bands[i];
  (void)M;
  return L;
}
// num_groups bands of equal-ish size, aligned to `align` rows.
GroupLayout EvenLayout(int64_t M, int num_blocks, int groups, int align) {
  const int64_t rows = M / num_blocks;
  const int64_t units = (rows + align - 1) / align;
  if (groups > units) groups = int(units);
  std::vector<int> b;
  for (int g = 0; g <= groups; ++g) b.push_back(int(std::min<int64_t>(rows, (units * g / groups) * align)));
  return MakeLayout(M, num_blocks, b);
}
// dst row of every logical row (signaling_gemm.h).
std::vector<int> DstRows(int64_t M, const GroupLayout& L) {
  std::vector<int> d(M);
  const int64_t rpb = M / L.num_blocks;
  for (int64_t r = 0; r < M; ++r) {
    const int64_t j = r / rpb, o = r % rpb;
    int g = 0;
    while (L.band_rows[g + 1] <= o) ++g;
    const int64_t h = L.band_rows[g + 1] - L.band_rows[g];
    d[r] = int(L.num_blocks * L.band_rows[g] + j * h + (o - L.band_rows[g]));
  }
  return d;
}

std::string g_json_cases;  // comma-separated JSON objects
int g_failures = 0;
void AddJson(const std::string& obj) { g_json_cases += (g_json_cases.empty() ? "" : ",\n") + obj; }

// What a test program's main() starts with: device 0 (printed), a stream, kMaxGroups counters.
struct TestDevice {
  cudaStream_t stream;
  int* counters;
};
TestDevice StartTestDevice() {
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  TestDevice d;
  CK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  CK(cudaMalloc(&d.counters, sizeof(int) * kMaxGroups));
  return d;
}
// ... and ends with: the JSON report ({"mode", `fields` (",\"key\":value..." or ""), "failures",
// "results"}) when a path was given, the failure count; returns the exit code (1: a check failed).
int FinishTest(TestDevice& d, const std::string& mode, const std::string& json_path,
               const std::string& fields = "") {
  CK(cudaDeviceSynchronize());
  if (!json_path.empty()) {
    if (FILE* f = fopen(json_path.c_str(), "w")) {
      fprintf(f, "{\"mode\":\"%s\"%s,\"failures\":%d,\"results\":[\n%s\n]}\n", mode.c_str(), fields.c_str(),
              g_failures, g_json_cases.c_str());
      fclose(f);
    }
  }
  printf("%s: %d failure(s)\n", mode.c_str(), g_failures);
  CK(cudaFree(d.counters));
  return g_failures ? 1 : 0;
}
const char* DtName(GemmDType d) { return d == GemmDType::kBFloat16 ? "bf16" : "f16"; }

struct RunResult {
  cudaError_t launch;
  double rel_err;
  unsigned long long bad;    // non-finite outputs (unwritten: the poison is NaN)
  unsigned long long wrong;  // finite but off the reference by > 2% of |ref| + 2% of its rms
  bool counters_ok;
  GemmLaunchInfo info;
};

// Poison, zero counters, launch (LaunchSignalingGemm, or `launch` when given: e.g. with
// helper launches), compare with the fp32 reference and check counters.
RunResult RunAndCheck(SignalingGemmArgs a, const float* ref, int* counters, cudaStream_t s,
                      const std::function<cudaError_t(const SignalingGemmArgs&)>& launch = {}) {
  RunResult r{};
  const GroupLayout& L = a.layout;
  CK(cudaMemsetAsync(a.out, 0xFF, size_t(a.m) * a.n * 2, s));
  CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
  a.counters = counters;
  if (a.queue == nullptr) a.queue = GemmQueue();
  r.launch = launch ? launch(a) : LaunchSignalingGemm(a, s);
  if (r.launch != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); return r; }
  r.info = LastSignalingGemmLaunch();
  CK(cudaGetLastError());
  std::vector<int> dst = DstRows(a.m, L);
  Buf d_dst(dst.size() * 4), acc(16), bad(8);
  CK(cudaMemcpyAsync(d_dst.p, dst.data(), dst.size() * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(acc.p, 0, 16, s));
  CK(cudaMemsetAsync(bad.p, 0, 8, s));
  if (a.dtype == GemmDType::kBFloat16)
    ErrorStats<<<1024, 256, 0, s>>>((const __nv_bfloat16*)a.out, ref, (int*)d_dst.p, a.m, a.n, (double*)acc.p, (unsigned long long*)bad.p);
  else
    ErrorStats<<<1024, 256, 0, s>>>((const __half*)a.out, ref, (int*)d_dst.p, a.m, a.n, (double*)acc.p, (unsigned long long*)bad.p);
  CK(cudaGetLastError());
  double h_acc[2];
  int h_cnt[kMaxGroups];
  CK(cudaMemcpyAsync(h_acc, acc.p, 16, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&r.bad, bad.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(h_cnt, counters, sizeof(h_cnt), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  r.rel_err = std::sqrt(h_acc[0] / std::max(h_acc[1], 1e-30));
  const float rms = float(std::sqrt(h_acc[1] / double(a.m * a.n)));
  Buf wrong(8);
  CK(cudaMemsetAsync(wrong.p, 0, 8, s));
  if (a.dtype == GemmDType::kBFloat16)
    CountWrong<<<1024, 256, 0, s>>>((const __nv_bfloat16*)a.out, ref, (int*)d_dst.p, a.m, a.n, 0.02f, 0.02f * rms,
                                    (unsigned long long*)wrong.p);
  else
    CountWrong<<<1024, 256, 0, s>>>((const __half*)a.out, ref, (int*)d_dst.p, a.m, a.n, 0.02f, 0.02f * rms,
                                    (unsigned long long*)wrong.p);
  CK(cudaGetLastError());
  CK(cudaMemcpyAsync(&r.wrong, wrong.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  r.counters_ok = true;
  for (int g = 0; g < L.num_groups; ++g) r.counters_ok &= (h_cnt[g] == TilesInGroup(a, g));
  return r;
}

// ---------------------------------------------------------------- a problem
struct Shape3 { int64_t m, n, k; };

// DESIGN.md per-GPU shapes (global K split over 2 GPUs).
const Shape3 kDesignShapes[] = {{4096, 8192, 4096}, {8192, 8192, 4096}, {16384, 8192, 8192},
                                {8192, 28672, 4096}, {8192, 8192, 14336}};

// Fresh random x and w, their fp32 reference, and the launch args of one GEMM.
struct Problem {
  Shape3 s;
  GemmDType dt;
  Buf x, w, out;
  Buf ref;  // fp32 [M,N]
  SignalingGemmArgs base;  // x, w, out, shape; w as [N, K] under GEMM_TEST_TRANSPOSE_W
  TransposedW wt;
  Problem(Shape3 s_, GemmDType dt_, uint64_t seed, cudaStream_t st, bool with_ref = true)
      : s(s_), dt(dt_), x(s_.m * s_.k * 2), w(s_.k * s_.n * 2), out(s_.m * s_.n * 2),
        ref(with_ref ? s_.m * s_.n * 4 : 16), base(Filled(st, seed, with_ref)), wt(base, st) {}
  SignalingGemmArgs Filled(cudaStream_t st, uint64_t seed, bool with_ref) {
    Fill(x.p, s.m * s.k, dt, seed, st);
    Fill(w.p, s.k * s.n, dt, seed + 1, st);
    if (with_ref) Reference(x.p, w.p, (float*)ref.p, int(s.m), int(s.n), int(s.k), dt, st);
    SignalingGemmArgs a;
    a.x = x.p; a.w = w.p; a.out = out.p;
    a.m = s.m; a.n = s.n; a.k = s.k;
    a.dtype = dt;
    return a;
  }
  SignalingGemmArgs Args(const GroupLayout& L, int comm_sms) const {
    SignalingGemmArgs a = base;
    a.comm_sms = comm_sms; a.layout = L;
    a.queue = GemmQueue();
    return a;
  }
};

// ---------------------------------------------------------------- timing
// Median times (ms) of several launch sequences on `s`, interleaved (one of each per round,
// so the power cap's clock drift reaches them alike), after two warm-up rounds; round i runs
// them in row i of a balanced Latin square (round_order.h), so each takes each place and
// follows each other sequence alike (until session 48 one fixed order; each sequence is
// self-contained: it resets whatever it uses).
std::vector<float> TimeInterleaved(const std::vector<std::function<void()>>& runs, cudaStream_t s, int iters) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<std::vector<float>> ms(runs.size());
  for (int i = 0; i < iters + 2; ++i) {
    for (size_t j = 0; j < runs.size(); ++j) {
      const size_t r = BalancedRoundIndex(runs.size(), size_t(i), j);
      CK(cudaEventRecord(a, s));
      runs[r]();
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float t = 0;
      CK(cudaEventElapsedTime(&t, a, b));
      if (i >= 2) ms[r].push_back(t);
    }
  }
  std::vector<float> med;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return med;
}
