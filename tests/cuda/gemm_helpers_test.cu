// Standalone test + benchmark of the signaling GEMM's helper launches (signaling_gemm.h:
// LaunchSignalingGemmHelpers): small grids on the SMs left to communication that take units
// from the main launch's queue between two collectives.
//   gemm_helpers_test check : the main launch on one stream; on a second stream, per group g,
//                             a helper launch (units of groups <= g) then a wait for group g's
//                             counter, as the overlapped calls order them. Poisoned output,
//                             fp32 reference, counters, each case 3 times back to back (stale
//                             ring entries of an earlier call must never match), and where
//                             the helpers have room, the units they took (must be > 0).
//   gemm_helpers_test bench : what the helpers give back when a collective of the group's
//                             share of `--comm-fraction` x the GEMM's time holds comm_sms SMs
//                             after each group (emulated: comm_sms CTAs that sleep, one per
//                             SM; no NCCL, no memory traffic): GEMM time with comm_sms 0, with
//                             comm_sms alone, with the emulated collectives, with them and
//                             helpers (CUDA events, median of --iters).
//   gemm_helpers_test sanitize : two small check cases, once each (for compute-sanitizer)
//   gemm_helpers_test all   : check + bench
// Options: --json PATH, --iters N (bench, default 20), --comm-fraction F (default 0.3).
// Exit code 1 if any check failed.
#include <algorithm>

#include "gemm_test_common.cuh"

namespace {

// One-thread wait for a counter (the test has no NCCL, so no stream_wait.cc): it takes an SM
// only between two helper launches, as the product's spin wait does.
__global__ void WaitCounterGeq(const int* counter, int value) {
  while (LoadAcquire(counter) < value) __nanosleep(200);
}

// An emulated collective: `blocks` CTAs, one per SM (their shared memory leaves no room for a
// GEMM CTA beside them), that sleep `ns`.
constexpr int kCommSmemBytes = 160 * 1024;
__global__ void EmulatedCollective(int64_t ns) {
  extern __shared__ char smem[];
  if (threadIdx.x == 0) smem[0] = 0;
  const uint64_t t0 = GlobalTimer();
  while (int64_t(GlobalTimer() - t0) < ns) __nanosleep(1000);
}

// The units helper launches took in the last call (queue bytes 4..7, signaling_gemm.h).
unsigned HelperUnits(cudaStream_t s) {
  unsigned v = 0;
  CK(cudaMemcpyAsync(&v, static_cast<char*>(GemmQueue()) + 4, 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return v;
}

struct HelperStreams {
  cudaStream_t side;
  cudaEvent_t queue_reset, side_done;
  HelperStreams() {
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&queue_reset, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&side_done, cudaEventDisableTiming));
  }
};

// The overlapped call's order without NCCL: main launch on `s`; on the side stream after its
// queue reset, per group: [helpers up to g] -> wait for g's counter -> [emulated collective
// of comm_ns[g]]; then `s` waits for the side stream. helpers false: no helper launches.
cudaError_t LaunchOverlapped(SignalingGemmArgs a, bool helpers, const std::vector<int64_t>& comm_ns,
                             cudaStream_t s, HelperStreams& hs) {
  a.helpers = helpers;
  a.queue_reset = hs.queue_reset;
  const cudaError_t e = LaunchSignalingGemm(a, s);
  if (e != cudaSuccess) return e;
  const bool launch_helpers = helpers && LastSignalingGemmLaunch().helper_clusters > 0;
  CK(cudaStreamWaitEvent(hs.side, hs.queue_reset, 0));
  for (int g = 0; g < a.layout.num_groups; ++g) {
    if (launch_helpers) {
      const cudaError_t h = LaunchSignalingGemmHelpers(a, g, hs.side);
      if (h != cudaSuccess) return h;
    }
    if (a.counters != nullptr) {
      WaitCounterGeq<<<1, 32, 0, hs.side>>>(a.counters + g, int(TilesInGroup(a, g)));
      CK(cudaGetLastError());
    }
    if (!comm_ns.empty() && a.comm_sms > 0) {
      EmulatedCollective<<<a.comm_sms, 128, kCommSmemBytes, hs.side>>>(comm_ns[g]);
      CK(cudaGetLastError());
    }
  }
  CK(cudaEventRecord(hs.side_done, hs.side));
  CK(cudaStreamWaitEvent(s, hs.side_done, 0));
  return cudaSuccess;
}

struct Problem {
  int64_t m, n, k;
  GemmDType dt;
  Buf x, w, out, ref;
  SignalingGemmArgs base;
  TransposedW wt;
  Problem(int64_t m_, int64_t n_, int64_t k_, GemmDType dt_, uint64_t seed, cudaStream_t s)
      : m(m_), n(n_), k(k_), dt(dt_), x(m_ * k_ * 2), w(k_ * n_ * 2), out(m_ * n_ * 2), ref(m_ * n_ * 4),
        base(Filled(seed, s)), wt(base, s) {}
  SignalingGemmArgs Filled(uint64_t seed, cudaStream_t s) {
    Fill(x.p, m * k, dt, seed, s);
    Fill(w.p, k * n, dt, seed + 1, s);
    Reference(x.p, w.p, (float*)ref.p, int(m), int(n), int(k), dt, s);
    SignalingGemmArgs a;
    a.x = x.p; a.w = w.p; a.out = out.p;
    a.m = m; a.n = n; a.k = k;
    a.dtype = dt;
    a.queue = GemmQueue();
    return a;
  }
};

struct CheckCase { int64_t m, n, k; GemmDType dt; int nb, groups, comm; const char* tile; bool must_help; };

void Check(cudaStream_t s, int* counters, bool sanitize) {
  HelperStreams hs;
  using C = CheckCase;
  const GemmDType B = GemmDType::kBFloat16, H = GemmDType::kFloat16;
  // Under compute-sanitizer: small problems, many SMs to the helpers, one run each.
  const std::vector<C> small = {
      {4096, 1024, 1024, B, 1, 4, 100, "256", false},  // 64 units, 16 main clusters
      {1536, 512, 1088, H, 2, 3, 112, "128", false},   // 48 units, 20 main CTAs
  };
  const std::vector<C> cases = sanitize ? small : std::vector<C>{
      {8192, 8192, 4096, B, 1, 6, 8, nullptr, true},     // the all-reduce's 8192^3 shape
      {8192, 8192, 4096, B, 2, 6, 16, nullptr, true},    // reduce-scatter layout
      {8192, 8192, 1024, H, 1, 4, 64, nullptr, true},    // helpers with many SMs; split tail
      {4096, 8192, 4096, B, 1, 5, 8, nullptr, false},    // split tail at comm 8
      {5000, 7168, 1000, H, 4, 3, 16, nullptr, false},   // partial tiles, idle cluster partners
      {8192, 8192, 1536, B, 1, 8, 32, "128", true},      // 128x128 tiles, no cluster
      {2048, 2048, 2048, B, 1, 64, 16, nullptr, false},  // 64 groups (ring epochs up to 64)
      {1000, 512, 512, H, 1, 2, 8, nullptr, false},      // fewer units than clusters
  };
  uint64_t seed = 9000;
  for (const C& c : cases) {
    if (c.tile) setenv("FLASHOVERLAP_GEMM_TILE", c.tile, 1); else unsetenv("FLASHOVERLAP_GEMM_TILE");
    Problem p(c.m, c.n, c.k, c.dt, seed += 10, s);
    SignalingGemmArgs a = p.base;
    a.comm_sms = c.comm;
    a.layout = EvenLayout(c.m, c.nb, c.groups, 128);
    a.helpers = true;
    for (int rep = 0; rep < (sanitize ? 1 : 3); ++rep) {
      RunResult r = RunAndCheck(a, (const float*)p.ref.p, counters, s, [&](const SignalingGemmArgs& args) {
        return LaunchOverlapped(args, true, {}, s, hs);
      });
      const unsigned helped = r.launch == cudaSuccess ? HelperUnits(s) : 0;
      const bool help_ok = !c.must_help || (r.info.helper_clusters > 0 && helped > 0);
      const bool pass = r.launch == cudaSuccess && r.bad == 0 && r.wrong == 0 && r.rel_err < 1e-2 &&
                        r.counters_ok && help_ok;
      if (!pass) ++g_failures;
      printf("helpers %-5s %5lldx%5lldx%5lld nb=%d groups=%2d comm=%2d rep %d: rel_err=%.2e nonfinite=%llu wrong=%llu "
             "counters=%s clusters=%d+%d helpers took %u of %d units %s\n",
             DtName(c.dt), (long long)c.m, (long long)c.n, (long long)c.k, c.nb, a.layout.num_groups, c.comm, rep,
             r.rel_err, r.bad, r.wrong, r.counters_ok ? "ok" : "BAD", r.info.clusters, r.info.helper_clusters, helped,
             r.info.units, pass ? "PASS" : "FAIL");
      char buf[512];
      snprintf(buf, sizeof buf,
               "{\"tag\":\"helpers\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"dtype\":\"%s\",\"num_blocks\":%d,\"groups\":%d,"
               "\"comm_sms\":%d,\"rep\":%d,\"rel_err\":%.3e,\"nonfinite\":%llu,\"wrong\":%llu,\"clusters\":%d,"
               "\"helper_clusters\":%d,\"helper_units\":%u,\"units\":%d,\"split_units\":%d,\"pass\":%s}",
               (long long)c.m, (long long)c.n, (long long)c.k, DtName(c.dt), c.nb, a.layout.num_groups, c.comm, rep,
               r.rel_err, r.bad, r.wrong, r.info.clusters, r.info.helper_clusters, helped, r.info.units,
               r.info.split_units, pass ? "true" : "false");
      AddJson(buf);
      fflush(stdout);
    }
    unsetenv("FLASHOVERLAP_GEMM_TILE");
  }
  // Bad helper arguments are refused with a message.
  Problem p(512, 512, 512, B, 77, s);
  SignalingGemmArgs a = p.base;
  a.layout = EvenLayout(512, 1, 2, 128);
  a.comm_sms = 8;
  struct Bad { const char* what; SignalingGemmArgs args; int group; };
  SignalingGemmArgs no_flag = a;
  SignalingGemmArgs with = a;
  with.helpers = true;
  for (const Bad& b : {Bad{"helpers not asked for", no_flag, 0}, Bad{"until_group -1", with, -1},
                       Bad{"until_group == num_groups", with, 2}}) {
    const cudaError_t got = LaunchSignalingGemmHelpers(b.args, b.group, s);
    const bool pass = got == cudaErrorInvalidValue && strlen(LastSignalingGemmError()) > 0;
    if (!pass) ++g_failures;
    printf("helpers api %-28s -> %s '%s' %s\n", b.what, cudaGetErrorName(got), LastSignalingGemmError(),
           pass ? "PASS" : "FAIL");
  }
  CK(cudaStreamSynchronize(s));
}

float TimeMs(const std::function<void()>& run, cudaStream_t s, int iters) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < iters + 2; ++i) {
    CK(cudaEventRecord(a, s));
    run();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);  // warm-up
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Bench(cudaStream_t s, int* counters, int iters, double fraction) {
  HelperStreams hs;
  CK(cudaFuncSetAttribute(EmulatedCollective, cudaFuncAttributeMaxDynamicSharedMemorySize, kCommSmemBytes));
  struct C { int64_t m, n, k; int nb, groups, comm; };
  const std::vector<C> cases = {{4096, 8192, 4096, 1, 6, 16}, {8192, 8192, 4096, 1, 6, 16},
                                {8192, 8192, 4096, 2, 6, 16}, {8192, 8192, 14336, 1, 17, 8},
                                {8192, 8192, 14336, 2, 16, 8}, {8192, 28672, 4096, 1, 6, 16}};
  printf("%-22s %3s %6s %5s | %9s %9s %11s %13s %6s\n", "M x N x K", "nb", "groups", "comm", "comm 0", "comm c",
         "c + coll.", "c+coll.+help", "gain");
  uint64_t seed = 12000;
  for (const C& c : cases) {
    Problem p(c.m, c.n, c.k, GemmDType::kBFloat16, seed += 10, s);
    SignalingGemmArgs a = p.base;
    a.layout = EvenLayout(c.m, c.nb, c.groups, 256);
    a.counters = counters;
    auto gemm = [&](int comm) {
      SignalingGemmArgs b = a;
      b.comm_sms = comm;
      return [b, s, counters]() {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        if (LaunchSignalingGemm(b, s) != cudaSuccess) { fprintf(stderr, "%s\n", LastSignalingGemmError()); exit(2); }
      };
    };
    const float t0 = TimeMs(gemm(0), s, iters);
    const float tc = TimeMs(gemm(c.comm), s, iters);
    // Each group's emulated collective: its rows' share of fraction x the GEMM at comm c.
    std::vector<int64_t> comm_ns(a.layout.num_groups);
    const int64_t rows = c.m / c.nb;
    for (int g = 0; g < a.layout.num_groups; ++g)
      comm_ns[g] = int64_t(fraction * tc * 1e6 * (a.layout.band_rows[g + 1] - a.layout.band_rows[g]) / rows);
    auto overlapped = [&](bool helpers) {
      SignalingGemmArgs b = a;
      b.comm_sms = c.comm;
      return [b, helpers, &comm_ns, s, &hs, counters]() {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        if (LaunchOverlapped(b, helpers, comm_ns, s, hs) != cudaSuccess) {
          fprintf(stderr, "%s\n", LastSignalingGemmError());
          exit(2);
        }
      };
    };
    const float plain = TimeMs(overlapped(false), s, iters);
    const float helped = TimeMs(overlapped(true), s, iters);
    const unsigned units = HelperUnits(s);
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-22s %3d %6d %5d | %9.3f %9.3f %11.3f %13.3f %5.1f%%  (helpers took %u units)\n", shape, c.nb,
           a.layout.num_groups, c.comm, t0, tc, plain, helped, 100.0 * (plain - helped) / plain, units);
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"bench\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"num_blocks\":%d,\"groups\":%d,\"comm_sms\":%d,"
             "\"comm_fraction\":%.3f,\"gemm_comm0_ms\":%.4f,\"gemm_comm_ms\":%.4f,\"with_collectives_ms\":%.4f,"
             "\"with_collectives_and_helpers_ms\":%.4f,\"helper_units_last_call\":%u}",
             (long long)c.m, (long long)c.n, (long long)c.k, c.nb, a.layout.num_groups, c.comm, fraction, t0, tc,
             plain, helped, units);
    AddJson(buf);
    fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  std::string json_path;
  int iters = 20;
  double fraction = 0.3;
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--comm-fraction") && i + 1 < argc) fraction = atof(argv[++i]);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if (iters < 1 || !(fraction >= 0 && fraction < 10)) { fprintf(stderr, "bad --iters / --comm-fraction\n"); return 2; }
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* counters;
  CK(cudaMalloc(&counters, sizeof(int) * kMaxGroups));
  // Load the wait kernel now: under lazy loading its first launch would wait for the GEMM.
  WaitCounterGeq<<<1, 32, 0, s>>>(counters, 0);
  CK(cudaStreamSynchronize(s));
  if (mode == "check" || mode == "all" || mode == "sanitize") Check(s, counters, mode == "sanitize");
  if (mode == "bench" || mode == "all") Bench(s, counters, iters, fraction);
  CK(cudaDeviceSynchronize());
  if (!json_path.empty()) {
    if (FILE* f = fopen(json_path.c_str(), "w")) {
      fprintf(f, "{\"mode\":\"%s\",\"iters\":%d,\"comm_fraction\":%.3f,\"failures\":%d,\"results\":[\n%s\n]}\n",
              mode.c_str(), iters, fraction, g_failures, g_json_cases.c_str());
      fclose(f);
    }
  }
  printf("%s: %d failure(s)\n", mode.c_str(), g_failures);
  CK(cudaFree(counters));
  return g_failures ? 1 : 0;
}
