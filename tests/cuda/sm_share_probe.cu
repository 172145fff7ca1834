// What a GEMM loses when some SMs are not its own (one GPU, no NCCL).
//
// The overlapped ops leave comm_sms SMs to NCCL. Our persistent GEMM then runs on the rest;
// the question this probe answers is whether cuBLAS does better on the same reduced SM count
// (DESIGN.md's "pair ceiling" used cuBLASLt with an SM-count target), and why:
//   cublas            cublasGemmEx, all SMs
//   cublas_target     the same with cublasSetSmCountTarget(132 - S)
//   cublas_held       all SMs asked for, while a spinner kernel holds S SMs (one CTA per SM,
//                     all shared memory, so nothing else fits there): truly 132 - S SMs
//   cublas_target_held  both
//   ours_S            our signaling GEMM with comm_sms = S (grid of (132 - S) / 2 clusters)
//   ours_S_held       the same while the spinner holds S SMs (do the clusters still fit?),
//                     with the dynamic tile queue (default) and with the round-robin order (rr)
// Each round runs every variant once (a batch of back-to-back launches, CUDA events), so
// clock drift hits all alike; reported: the median per-launch time over rounds, and the SM
// clock and board power sampled through NVML while the batches ran.
//
//   nvcc ... -o sm_share_probe sm_share_probe.cu <kernel objects> -ldl   (tests/cuda/build.sh)
//   ./sm_share_probe [out.json] [--no-held]
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gemm_test_common.cuh"

namespace {

struct Shape { int64_t m, n, k; };
const Shape kShapes[] = {{4096, 8192, 4096}, {8192, 8192, 4096}, {16384, 8192, 8192},
                         {8192, 28672, 4096}};

// ---------------------------------------------------------------- spinner
// One CTA per SM (all of the SM's shared memory): it reports that it runs (host-mapped
// counter), then spins on a flag in device memory (not host memory: no PCIe traffic while
// the GEMM runs) until a copy on another stream sets it.
__global__ void HoldSms(volatile int* started, volatile int* stop) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0) {
    smem[0] = blockIdx.x;
    atomicAdd((int*)started, 1);
    __threadfence_system();
    while (*stop == 0) __nanosleep(2000);
  }
  __syncthreads();
  if (smem[0] < 0) started[1] = 0;  // keeps smem in use
}

struct Spinner {
  int* started = nullptr;  // host-mapped
  int* d_started = nullptr;
  int* d_stop = nullptr;   // device memory
  int* h_one = nullptr;    // pinned host: the value copied into *d_stop
  int smem = 0;
  cudaStream_t stream{}, release{};
  Spinner() {
    CK(cudaHostAlloc(&started, 2 * sizeof(int), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void**)&d_started, started, 0));
    CK(cudaMalloc(&d_stop, sizeof(int)));
    CK(cudaHostAlloc(&h_one, sizeof(int), cudaHostAllocDefault));
    *h_one = 1;
    CK(cudaStreamCreateWithFlags(&release, cudaStreamNonBlocking));
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CK(cudaFuncSetAttribute(HoldSms, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  // Returns once `sms` CTAs are resident (each on its own SM).
  void Hold(int sms) {
    started[0] = 0;
    CK(cudaMemsetAsync(d_stop, 0, sizeof(int), stream));
    HoldSms<<<sms, 32, smem, stream>>>(d_started, d_stop);
    CK(cudaGetLastError());
    const auto t0 = std::chrono::steady_clock::now();
    while (((volatile int*)started)[0] < sms) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
        fprintf(stderr, "spinner: only %d of %d CTAs resident after 10 s\n", started[0], sms);
        exit(2);
      }
    }
  }
  void Release() {
    CK(cudaMemcpyAsync(d_stop, h_one, sizeof(int), cudaMemcpyHostToDevice, release));
    CK(cudaStreamSynchronize(stream));
  }
};

// ---------------------------------------------------------------- NVML through dlopen
// (the few declarations used, from NVML's stable C API: the toolkit here has no nvml.h)
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
typedef int nvmlClockType_t;
constexpr nvmlClockType_t NVML_CLOCK_SM = 1;
struct Nvml {
  nvmlDevice_t dev{};
  nvmlReturn_t (*clock)(nvmlDevice_t, nvmlClockType_t, unsigned int*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  void Load() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "NVML not loaded: %s (no clock readings)\n", dlerror()); return; }
    auto init = (nvmlReturn_t(*)())dlsym(lib, "nvmlInit_v2");
    auto by_index = (nvmlReturn_t(*)(unsigned, nvmlDevice_t*))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    clock = (decltype(clock))dlsym(lib, "nvmlDeviceGetClockInfo");
    power = (decltype(power))dlsym(lib, "nvmlDeviceGetPowerUsage");
    int cuda_dev = 0;
    CK(cudaGetDevice(&cuda_dev));
    if (!init || !by_index || !clock || !power || init() != NVML_SUCCESS ||
        by_index(unsigned(cuda_dev), &dev) != NVML_SUCCESS) {
      fprintf(stderr, "NVML unusable (no clock readings)\n");
      clock = nullptr;
    }
  }
  bool ok() const { return clock != nullptr; }
};

struct Variant {
  std::string name;
  int held;        // SMs held by the spinner (0: none)
  int sm_target;   // cuBLAS SM-count target (0: none); ours: -1
  int comm_sms;    // ours only
  bool queue = true;  // ours: the dynamic tile queue (false: round robin)
  std::vector<float> ms;
  std::vector<float> mhz, watts;
};

float Median(std::vector<float> v) {
  if (v.empty()) return 0.f;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  // sm_share_probe [out.json] [--no-held]
  const char* json_path = nullptr;
  bool held_variants = true;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--no-held") held_variants = false;
    else json_path = argv[i];
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Cublas cublas;
  cublas.Load();
  if (!cublas.ok()) return 2;
  typedef int (*SmTargetFn)(cublasHandle_t, int);
  void* lib = dlopen(getenv("CUBLAS_LIB") ? getenv("CUBLAS_LIB") : "libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  auto set_target = lib ? (SmTargetFn)dlsym(lib, "cublasSetSmCountTarget") : nullptr;
  if (!set_target) { fprintf(stderr, "cublasSetSmCountTarget missing\n"); return 2; }
  Nvml nvml;
  nvml.Load();
  Spinner spinner;
  int* counters = nullptr;
  CK(cudaMalloc(&counters, sizeof(int) * kMaxGroups));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  std::string json, table;
  for (const Shape& sh : kShapes) {
    Buf x(sh.m * sh.k * 2), w(sh.k * sh.n * 2), out(sh.m * sh.n * 2);
    Fill(x.p, sh.m * sh.k, GemmDType::kBFloat16, 11, s);
    Fill(w.p, sh.k * sh.n, GemmDType::kBFloat16, 12, s);
    std::vector<Variant> vs;
    vs.push_back({"cublas", 0, 0, 0});
    vs.push_back({"ours_0", 0, -1, 0});
    vs.push_back({"ours_rr_0", 0, -1, 0, false});
    for (int held : {8, 16}) {
      vs.push_back({"cublas_target", 0, sms - held, 0});
      if (held_variants) {
        vs.push_back({"cublas_held", held, 0, 0});
        vs.push_back({"cublas_target_held", held, sms - held, 0});
      }
      vs.push_back({"ours", 0, -1, held});
      vs.push_back({"ours_rr", 0, -1, held, false});
      if (held_variants) {
        vs.push_back({"ours_held", held, -1, held});
        vs.push_back({"ours_rr_held", held, -1, held, false});
      }
    }
    const int batch = sh.m * sh.n * sh.k > (int64_t(1) << 38) ? 6 : 12;
    auto launch = [&](const Variant& v) {
      if (v.sm_target >= 0) {
        if (set_target(cublas.h, v.sm_target) != 0) { fprintf(stderr, "SmCountTarget failed\n"); exit(2); }
        if (cublas.Run(x.p, w.p, out.p, int(sh.m), int(sh.n), int(sh.k), GemmDType::kBFloat16, s) != 0) {
          fprintf(stderr, "cublasGemmEx failed\n"); exit(2);
        }
        return;
      }
      SignalingGemmArgs a;
      a.x = x.p; a.w = w.p; a.out = out.p;
      a.m = sh.m; a.n = sh.n; a.k = sh.k;
      a.comm_sms = v.comm_sms;
      a.layout = EvenLayout(sh.m, 1, 4, 256);
      a.counters = counters;
      a.queue = v.queue ? GemmQueue() : nullptr;
      if (LaunchSignalingGemm(a, s) != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); exit(2); }
    };
    const int kRounds = 9;
    for (int round = -1; round < kRounds; ++round) {  // round -1: warm-up
      for (Variant& v : vs) {
        if (v.held) spinner.Hold(v.held);
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        CK(cudaEventRecord(e0, s));
        for (int b = 0; b < batch; ++b) launch(v);
        CK(cudaEventRecord(e1, s));
        // Sample the clock and power while the batch runs.
        std::vector<float> mhz, watts;
        while (cudaEventQuery(e1) == cudaErrorNotReady) {
          unsigned c = 0, p = 0;
          if (nvml.ok() && nvml.clock(nvml.dev, NVML_CLOCK_SM, &c) == NVML_SUCCESS &&
              nvml.power(nvml.dev, &p) == NVML_SUCCESS) {
            mhz.push_back(float(c));
            watts.push_back(p / 1000.f);
          }
          std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
        CK(cudaEventSynchronize(e1));
        if (v.held) spinner.Release();
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (round >= 0) {
          v.ms.push_back(ms / batch);
          if (!mhz.empty()) { v.mhz.push_back(Median(mhz)); v.watts.push_back(Median(watts)); }
        }
      }
    }
    const float base = Median(vs[0].ms);
    const double flop = 2.0 * sh.m * sh.n * sh.k;
    for (const Variant& v : vs) {
      const float t = Median(v.ms);
      const int held = v.held ? v.held : v.comm_sms ? v.comm_sms : v.sm_target > 0 ? sms - v.sm_target : 0;
      char buf[512];
      snprintf(buf, sizeof buf,
               "{\"m\":%lld,\"n\":%lld,\"k\":%lld,\"variant\":\"%s\",\"sms_not_ours\":%d,\"held_by_spinner\":%d,"
               "\"sm_count_target\":%d,\"comm_sms\":%d,\"ms\":%.4f,\"tflops\":%.1f,\"cublas_full_over_this\":%.3f,"
               "\"sm_mhz\":%.0f,\"watts\":%.0f,\"tile_order\":\"%s\"}",
               (long long)sh.m, (long long)sh.n, (long long)sh.k, v.name.c_str(), held, v.held,
               v.sm_target > 0 ? v.sm_target : 0, v.comm_sms, t, flop / t * 1e-9, base / t, Median(v.mhz),
               Median(v.watts), v.sm_target >= 0 ? "cublas" : v.queue ? "dynamic" : "round-robin");
      json += (json.empty() ? "" : ",\n") + std::string(buf);
      char line[256];
      snprintf(line, sizeof line, "%6lldx%6lldx%6lld  %-19s S=%2d  %.3f ms (%4.0f TF/s)  cublas/this %.3f  %4.0f MHz %4.0f W\n",
               (long long)sh.m, (long long)sh.n, (long long)sh.k, v.name.c_str(), held, t, flop / t * 1e-9,
               base / t, Median(v.mhz), Median(v.watts));
      table += line;
    }
  }
  printf("==== GEMM on fewer SMs (bf16; median of 9 interleaved rounds; S = SMs not the GEMM's) ====\n%s",
         table.c_str());
  if (json_path) {
    FILE* f = fopen(json_path, "w");
    if (!f) { fprintf(stderr, "cannot write %s\n", json_path); return 2; }
    fprintf(f, "{\"kind\":\"sm_share_probe\",\"device\":\"%s\",\"sms\":%d,\"results\":[\n%s\n]}\n", prop.name, sms,
            json.c_str());
    fclose(f);
  }
  return 0;
}
