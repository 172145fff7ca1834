// Standalone test of the signaling GEMM's extensions for issue #9 (signaling_gemm.h):
//   rotation : row_rotation (all-gather + GEMM order), poisoned output, fp32 reference, counters
//   colblock : column-blocked output [N/c, M, c] (GEMM + all-to-all, split_axis 1)
//   flags    : input flags: blocks of x arrive late from a second stream (copy + flag write
//              after a delay); rows not yet arrived hold NaNs, so a tile that loads before its
//              flag shows up as non-finite output. Stale flag values must not pass.
//   api      : bad extension arguments and launcher variables are rejected with a message
//   all      : everything (default)
// Options: --json PATH. Exit code 1 if any check failed.
#include "gemm_test_common.cuh"

namespace {

struct Case { int64_t m, n, k; GemmDType dt; };

// Column-blocked variant of ErrorStats: logical (r, c) lives at ((c/cb)*M + r)*cb + c%cb.
template <class T>
__global__ void ColBlockedStats(const T* out, const float* ref, int64_t M, int64_t N, int64_t cb,
                                double* acc, unsigned long long* bad) {
  double d2 = 0, r2 = 0;
  unsigned long long nbad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, c = i % N, j = c / cb;
    const float o = ToF(out[(j * M + r) * cb + (c - j * cb)]);
    if (!isfinite(o)) { ++nbad; continue; }
    d2 += double(o - ref[i]) * (o - ref[i]);
    r2 += double(ref[i]) * ref[i];
  }
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    nbad += __shfl_down_sync(0xffffffffu, nbad, off);
  }
  if (threadIdx.x % 32 == 0) { atomicAdd(acc, d2); atomicAdd(acc + 1, r2); atomicAdd(bad, nbad); }
}

__global__ void SleepKernel(int64_t ns) {
  const uint64_t t0 = GlobalTimer();
  while (int64_t(GlobalTimer() - t0) < ns) __nanosleep(1000);
}

__global__ void SetFlagKernel(int32_t* flag, int32_t value) {
  __threadfence_system();
  asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

void Report(const char* tag, const std::string& what, cudaError_t launch, double rel, unsigned long long bad,
            bool counters_ok) {
  const bool pass = launch == cudaSuccess && bad == 0 && rel < 1e-2 && counters_ok;
  if (!pass) ++g_failures;
  printf("%-8s %-60s launch=%s rel_err=%.2e nonfinite=%llu counters=%s %s\n", tag, what.c_str(),
         cudaGetErrorName(launch), rel, bad, counters_ok ? "ok" : "BAD", pass ? "PASS" : "FAIL");
  char buf[512];
  snprintf(buf, sizeof buf, "{\"tag\":\"%s\",\"what\":\"%s\",\"rel_err\":%.3e,\"nonfinite\":%llu,\"pass\":%s}",
           tag, what.c_str(), rel, bad, pass ? "true" : "false");
  AddJson(buf);
  fflush(stdout);
}

std::string Name(const Case& c, const GroupLayout& L, const char* extra) {
  char b[256];
  snprintf(b, sizeof b, "%s %lldx%lldx%lld groups=%d %s", DtName(c.dt), (long long)c.m, (long long)c.n,
           (long long)c.k, L.num_groups, extra);
  return b;
}

void Rotation(int* counters, cudaStream_t s) {
  struct R { Case c; int blocks, rot_block, sub; const char* tile; };
  const GemmDType B = GemmDType::kBFloat16, H = GemmDType::kFloat16;
  const std::vector<R> rs = {{{4096, 8192, 4096, B}, 2, 1, 2, nullptr}, {{8192, 8192, 4096, B}, 4, 3, 1, nullptr},
                             {{1000, 1024, 1000, B}, 2, 1, 1, "256"},   {{900, 7168, 512, H}, 3, 2, 2, "128"},
                             {{1000, 264, 72, H}, 8, 5, 1, nullptr},    {{2048, 4096, 1024, B}, 2, 0, 2, nullptr}};
  uint64_t seed = 300;
  for (const R& r : rs) {
    const int64_t f = r.c.m / r.blocks;
    std::vector<int> bands = {0};
    for (int b = 0; b < r.blocks; ++b)
      for (int q = 1; q <= r.sub; ++q) bands.push_back(int(b * f + f * q / r.sub));
    const GroupLayout L = MakeLayout(r.c.m, 1, bands);
    Buf x(r.c.m * r.c.k * 2), w(r.c.k * r.c.n * 2), out(r.c.m * r.c.n * 2), ref(r.c.m * r.c.n * 4);
    Fill(x.p, r.c.m * r.c.k, r.c.dt, seed += 10, s);
    Fill(w.p, r.c.k * r.c.n, r.c.dt, seed + 1, s);
    Reference(x.p, w.p, (float*)ref.p, int(r.c.m), int(r.c.n), int(r.c.k), r.c.dt, s);
    SignalingGemmArgs a;
    a.queue = GemmQueue();
    a.x = x.p; a.w = w.p; a.out = out.p; a.m = r.c.m; a.n = r.c.n; a.k = r.c.k; a.dtype = r.c.dt;
    a.comm_sms = 8; a.layout = L; a.row_rotation = int(r.rot_block * f);
    const TransposedW tw(a, s);
    if (r.tile) setenv("FLASHOVERLAP_GEMM_TILE", r.tile, 1);
    const RunResult res = RunAndCheck(a, (const float*)ref.p, counters, s);  // identity rows
    unsetenv("FLASHOVERLAP_GEMM_TILE");
    char extra[96];
    snprintf(extra, sizeof extra, "rotation=%d tile=%s", a.row_rotation, r.tile ? r.tile : "auto");
    Report("rotation", Name(r.c, L, extra), res.launch, res.rel_err, res.bad, res.counters_ok);
  }
}

void ColBlocked(int* counters, cudaStream_t s) {
  struct C { Case c; int cb, groups; const char* tile; };
  const GemmDType B = GemmDType::kBFloat16, H = GemmDType::kFloat16;
  const std::vector<C> cs = {{{4096, 8192, 4096, B}, 4096, 4, nullptr}, {{2048, 8192, 2048, B}, 1024, 2, nullptr},
                             {{127, 7168, 1000, H}, 1792, 1, nullptr},  {{1000, 7168, 512, B}, 1792, 3, "256"},
                             {{300, 264, 200, H}, 88, 2, "128"},        {{5000, 1024, 256, B}, 8, 4, nullptr}};
  uint64_t seed = 600;
  for (const C& c : cs) {
    const GroupLayout L = EvenLayout(c.c.m, 1, c.groups, 256);
    Buf x(c.c.m * c.c.k * 2), w(c.c.k * c.c.n * 2), out(c.c.m * c.c.n * 2), ref(c.c.m * c.c.n * 4);
    Fill(x.p, c.c.m * c.c.k, c.c.dt, seed += 10, s);
    Fill(w.p, c.c.k * c.c.n, c.c.dt, seed + 1, s);
    Reference(x.p, w.p, (float*)ref.p, int(c.c.m), int(c.c.n), int(c.c.k), c.c.dt, s);
    SignalingGemmArgs a;
    a.queue = GemmQueue();
    a.x = x.p; a.w = w.p; a.out = out.p; a.m = c.c.m; a.n = c.c.n; a.k = c.c.k; a.dtype = c.c.dt;
    a.comm_sms = 16; a.layout = L; a.out_col_block = c.cb; a.counters = counters;
    const TransposedW tw(a, s);
    if (c.tile) setenv("FLASHOVERLAP_GEMM_TILE", c.tile, 1);
    CK(cudaMemsetAsync(out.p, 0xFF, out.bytes, s));
    CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
    const cudaError_t e = LaunchSignalingGemm(a, s);
    if (e != cudaSuccess) fprintf(stderr, "launch: %s\n", LastSignalingGemmError());
    Buf acc(16), bad(8);
    CK(cudaMemsetAsync(acc.p, 0, 16, s));
    CK(cudaMemsetAsync(bad.p, 0, 8, s));
    if (c.c.dt == B) ColBlockedStats<<<1024, 256, 0, s>>>((const __nv_bfloat16*)out.p, (const float*)ref.p, c.c.m, c.c.n, c.cb, (double*)acc.p, (unsigned long long*)bad.p);
    else ColBlockedStats<<<1024, 256, 0, s>>>((const __half*)out.p, (const float*)ref.p, c.c.m, c.c.n, c.cb, (double*)acc.p, (unsigned long long*)bad.p);
    CK(cudaGetLastError());
    double h[2];
    unsigned long long nbad = 0;
    int cnt[kMaxGroups];
    CK(cudaMemcpyAsync(h, acc.p, 16, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(&nbad, bad.p, 8, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(cnt, counters, sizeof cnt, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    bool counters_ok = true;
    for (int g = 0; g < L.num_groups; ++g) counters_ok &= cnt[g] == TilesInGroup(a, g);
    unsetenv("FLASHOVERLAP_GEMM_TILE");
    char extra[96];
    snprintf(extra, sizeof extra, "col_block=%d tile=%s", c.cb, c.tile ? c.tile : "auto");
    Report("colblock", Name(c.c, L, extra), e, std::sqrt(h[0] / std::max(h[1], 1e-30)), nbad, counters_ok);
  }
}

// All-gather + GEMM without NCCL: block `rank` of the gathered x is there at once, the other
// blocks arrive chunk by chunk from a second stream, in the order the handler uses.
void Flags(cudaStream_t s) {
  struct F { Case c; int world, rank, chunks, comm; const char* tile; };
  const GemmDType B = GemmDType::kBFloat16, H = GemmDType::kFloat16;
  const std::vector<F> fs = {{{4096, 8192, 4096, B}, 2, 0, 1, 8, nullptr}, {{4096, 8192, 4096, B}, 2, 1, 2, 16, nullptr},
                             {{2000, 1024, 1000, B}, 4, 2, 2, 8, "256"},  {{1024, 8192, 512, H}, 8, 5, 1, 8, nullptr},
                             {{1000, 264, 72, H}, 4, 3, 1, 2, "128"}};
  cudaStream_t s2;
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  Buf flags(sizeof(int32_t) * kMaxGroups);
  int32_t value = 1000;
  uint64_t seed = 900;
  for (const F& f : fs) {
    const int64_t R = f.c.m / f.world, rows = R / f.chunks, row_bytes = f.c.k * 2;
    Buf truth(f.c.m * f.c.k * 2), x(f.c.m * f.c.k * 2), w(f.c.k * f.c.n * 2), out(f.c.m * f.c.n * 2), ref(f.c.m * f.c.n * 4);
    Fill(truth.p, f.c.m * f.c.k, f.c.dt, seed += 10, s);
    Fill(w.p, f.c.k * f.c.n, f.c.dt, seed + 1, s);
    Reference(truth.p, w.p, (float*)ref.p, int(f.c.m), int(f.c.n), int(f.c.k), f.c.dt, s);
    SignalingGemmArgs a;
    a.queue = GemmQueue();
    a.x = x.p; a.w = w.p; a.out = out.p; a.m = f.c.m; a.n = f.c.n; a.k = f.c.k; a.dtype = f.c.dt;
    a.comm_sms = f.comm;
    std::vector<int> bands;
    for (int g = 0; g <= f.world * f.chunks; ++g) bands.push_back(int(g * rows));
    a.layout = MakeLayout(f.c.m, 1, bands);
    a.row_rotation = int(f.rank * R);
    a.in_flags = (const int32_t*)flags.p;
    a.in_flag_rows = int(rows);
    const TransposedW tw(a, s);
    if (f.tile) setenv("FLASHOVERLAP_GEMM_TILE", f.tile, 1);
    for (int iter = 0; iter < 4; ++iter) {  // iteration 0 warms up (module loads) with all flags set
      a.in_flag_value = ++value;
      std::vector<int32_t> init(kMaxGroups, iter == 0 ? value : value - 1);  // stale values
      for (int c = 0; c < f.chunks; ++c) init[f.rank * f.chunks + c] = value;
      CK(cudaMemcpy(flags.p, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(x.p, 0xFF, x.bytes));  // NaN rows until they "arrive"
      CK(cudaMemcpy((char*)x.p + f.rank * R * row_bytes, (char*)truth.p + f.rank * R * row_bytes, R * row_bytes,
                    cudaMemcpyDeviceToDevice));
      CK(cudaMemset(out.p, 0xFF, out.bytes));
      if (iter == 0) CK(cudaMemcpy(x.p, truth.p, x.bytes, cudaMemcpyDeviceToDevice));
      CK(cudaDeviceSynchronize());
      if (iter > 0) {  // the second stream first, as the FFI handler enqueues it
        for (int step = 1; step < f.world; ++step) {
          const int src = (f.rank + step) % f.world;
          for (int c = 0; c < f.chunks; ++c) {
            SleepKernel<<<1, 1, 0, s2>>>(iter == 1 ? 20000 : 100000);
            const int64_t r0 = src * R + c * rows;
            CK(cudaMemcpyAsync((char*)x.p + r0 * row_bytes, (char*)truth.p + r0 * row_bytes, rows * row_bytes,
                               cudaMemcpyDeviceToDevice, s2));
            SetFlagKernel<<<1, 1, 0, s2>>>((int32_t*)flags.p + src * f.chunks + c, value);
          }
        }
        CK(cudaGetLastError());
      } else {
        SleepKernel<<<1, 1, 0, s2>>>(1000);
        SetFlagKernel<<<1, 1, 0, s2>>>((int32_t*)flags.p + kMaxGroups - 1, 0);
        CK(cudaStreamSynchronize(s2));
      }
      const cudaError_t e = LaunchSignalingGemm(a, s);
      if (e != cudaSuccess) fprintf(stderr, "launch: %s\n", LastSignalingGemmError());
      CK(cudaDeviceSynchronize());
      if (iter == 0) continue;
      std::vector<int> dst(f.c.m);
      for (int64_t r = 0; r < f.c.m; ++r) dst[r] = int(r);
      Buf d_dst(dst.size() * 4), acc(16), bad(8);
      CK(cudaMemcpy(d_dst.p, dst.data(), dst.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(acc.p, 0, 16));
      CK(cudaMemset(bad.p, 0, 8));
      if (f.c.dt == B) ErrorStats<<<1024, 256>>>((const __nv_bfloat16*)out.p, (const float*)ref.p, (int*)d_dst.p, f.c.m, f.c.n, (double*)acc.p, (unsigned long long*)bad.p);
      else ErrorStats<<<1024, 256>>>((const __half*)out.p, (const float*)ref.p, (int*)d_dst.p, f.c.m, f.c.n, (double*)acc.p, (unsigned long long*)bad.p);
      CK(cudaGetLastError());
      double h[2];
      unsigned long long nbad = 0;
      CK(cudaMemcpy(h, acc.p, 16, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&nbad, bad.p, 8, cudaMemcpyDeviceToHost));
      char extra[128];
      snprintf(extra, sizeof extra, "world=%d rank=%d chunks=%d comm=%d delay=%dus tile=%s", f.world, f.rank,
               f.chunks, f.comm, iter == 1 ? 20 : 100, f.tile ? f.tile : "auto");
      Report("flags", Name(f.c, a.layout, extra), e, std::sqrt(h[0] / std::max(h[1], 1e-30)), nbad, true);
    }
    unsetenv("FLASHOVERLAP_GEMM_TILE");
  }
  CK(cudaStreamDestroy(s2));
}

void Api(cudaStream_t s) {
  Buf x(512 * 64 * 2), w(64 * 256 * 2), out(512 * 256 * 2), flags(256);
  SignalingGemmArgs a;
  a.queue = GemmQueue();
  a.x = x.p; a.w = w.p; a.out = out.p; a.m = 512; a.n = 256; a.k = 64;
  a.layout = MakeLayout(512, 1, {0, 128, 256, 512});
  auto expect = [&](const char* what, SignalingGemmArgs b, cudaError_t want) {
    const cudaError_t got = LaunchSignalingGemm(b, s);
    const bool pass = got == want && (want == cudaSuccess || strlen(LastSignalingGemmError()) > 0);
    if (!pass) ++g_failures;
    printf("api      %-44s -> %-22s msg='%s' %s\n", what, cudaGetErrorName(got), got ? LastSignalingGemmError() : "",
           pass ? "PASS" : "FAIL");
  };
  CK(cudaMemset(flags.p, 0, 256));  // "ready" for in_flag_value 0 below
  SignalingGemmArgs b = a; b.row_rotation = 100; expect("rotation: wrap inside a band", b, cudaErrorInvalidValue);
  b = a; b.row_rotation = 512; expect("rotation >= M", b, cudaErrorInvalidValue);
  b = a; b.row_rotation = 256; b.layout = MakeLayout(512, 2, {0, 256}); expect("rotation with rank blocks", b, cudaErrorInvalidValue);
  b = a; b.row_rotation = 256; expect("rotation at a band boundary", b, cudaSuccess);
  b = a; b.out_col_block = 100; expect("col block not dividing N", b, cudaErrorInvalidValue);
  b = a; b.out_col_block = 4; expect("col block not a multiple of 8", b, cudaErrorInvalidValue);
  b = a; b.in_flags = (const int32_t*)flags.p; b.in_flag_rows = 256; b.in_flag_value = 0;
  expect("flags at band boundaries (all ready)", b, cudaSuccess);
  b.in_flag_rows = 64; expect("flag block boundary inside a band", b, cudaErrorInvalidValue);
  b.in_flag_rows = 256; b.row_rotation = 128; expect("rotation not a multiple of flag rows", b, cudaErrorInvalidValue);
  // Each dim at exactly 2^30 is refused by the size check, before any other (the check read
  // `> 2^30` while its message, and Python's plan.KERNEL_MAX_DIM, say `< 2^30`).
  for (int dim = 0; dim < 3; ++dim) {
    b = a;
    (dim == 0 ? b.m : dim == 1 ? b.n : b.k) = int64_t(1) << 30;
    expect(dim == 0 ? "M = 2^30" : dim == 1 ? "N = 2^30" : "K = 2^30", b, cudaErrorInvalidValue);
    if (!strstr(LastSignalingGemmError(), "must be < 2^30")) {
      ++g_failures;
      printf("api      the refusal names the size limit: '%s' FAIL\n", LastSignalingGemmError());
    }
  }
  // Several mirrors are stored a row at a time (MirrorStagedRows): out must be row-major.
  b = a; b.out_col_block = 128; b.mirror_count = 2;
  b.mirror_slots[0] = b.mirror_slots[1] = reinterpret_cast<const int32_t*>(flags.p);
  expect("several mirrors, column-blocked out", b, cudaErrorInvalidValue);
  if (!strstr(LastSignalingGemmError(), "several mirrors")) {
    ++g_failures;
    printf("api      the refusal names the mirrors: '%s' FAIL\n", LastSignalingGemmError());
  }
  // The launcher's integer variables are read at every launch: a word or a value out of
  // range is refused naming the variable (atoi once read SERPENTINE=true as 0: off).
  const struct { const char* var; const char* value; cudaError_t want; } env_cases[] = {
      {"FLASHOVERLAP_GEMM_SERPENTINE", "true", cudaErrorInvalidValue},
      {"FLASHOVERLAP_GEMM_PANEL", "0", cudaErrorInvalidValue},
      {"FLASHOVERLAP_GEMM_PANEL", "8x", cudaErrorInvalidValue},
      {"FLASHOVERLAP_GEMM_TILE", "64", cudaErrorInvalidValue},
      {"FLASHOVERLAP_GEMM_TILE", "300", cudaErrorInvalidValue},
      {"FLASHOVERLAP_GEMM_LOG", "2", cudaErrorInvalidValue},
      {"FLASHOVERLAP_GEMM_PANEL", " 4 ", cudaSuccess},
      {"FLASHOVERLAP_GEMM_SERPENTINE", "", cudaSuccess}};
  for (const auto& e : env_cases) {
    setenv(e.var, e.value, 1);
    expect((std::string(e.var) + "='" + e.value + "'").c_str(), a, e.want);
    if (e.want != cudaSuccess && !strstr(LastSignalingGemmError(), e.var)) {
      ++g_failures;
      printf("api      the refusal names %s: '%s' FAIL\n", e.var, LastSignalingGemmError());
    }
    // TILE: the values it takes, not a range ('300' was "an integer in [0, 256]")
    if (e.want != cudaSuccess && !strcmp(e.var, "FLASHOVERLAP_GEMM_TILE") &&
        !strstr(LastSignalingGemmError(), "must be 0, 128 or 256")) {
      ++g_failures;
      printf("api      the refusal lists TILE's values: '%s' FAIL\n", LastSignalingGemmError());
    }
    unsetenv(e.var);
  }
  CK(cudaStreamSynchronize(s));
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  std::string json_path;
  for (int i = 2; i < argc; ++i)
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
  TestDevice d = StartTestDevice();
  cudaStream_t s = d.stream;
  int* counters = d.counters;
  if (mode == "api" || mode == "all") Api(s);
  if (mode == "rotation" || mode == "all") Rotation(counters, s);
  if (mode == "colblock" || mode == "all") ColBlocked(counters, s);
  if (mode == "flags" || mode == "all") Flags(s);
  return FinishTest(d, mode, json_path);
}
