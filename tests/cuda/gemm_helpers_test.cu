// Standalone test + benchmark of the signaling GEMM's helper launches (signaling_gemm.h:
// LaunchSignalingGemmHelpers): small grids on the SMs left to communication that take units
// from the main launch's queue between two collectives.
//   gemm_helpers_test check : the main launch on one stream; on a second stream, per group g,
//                             a helper launch (units of groups <= g) then a wait for group g's
//                             counter, as the overlapped calls order them. Poisoned output,
//                             fp32 reference, counters, each case 3 times back to back (stale
//                             ring entries of an earlier call must never match), and where
//                             the helpers have room, the units they took (must be > 0).
//   gemm_helpers_test bench : what the helpers give back when after each group a collective
//                             holds comm_sms SMs for its rows' share of the time NCCL took
//                             capped at comm_sms on 2 x H200 (x --comm-scale), emulated:
//                             comm_sms CTAs that sleep, one per SM; no NCCL, no memory
//                             traffic. GEMM time with comm_sms 0, with comm_sms alone, with the
//                             emulated collectives, with them and helpers (CUDA events,
//                             interleaved, median of --iters).
//   gemm_helpers_test timeline : two cases' per-group times with and without helpers
//   gemm_helpers_test solo  : one group, no collective: one helper launch beside the whole GEMM
//   gemm_helpers_test sanitize : two small check cases, once each (for compute-sanitizer)
//   gemm_helpers_test all   : check + bench
// Options: --json PATH, --iters N (bench, default 20), --comm-scale F (default 1).
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
      {8192, 1024, 1024, B, 1, 64, 16, nullptr, false},  // 64 bands of 128 rows: ring epochs up to 64
      {1000, 512, 512, H, 1, 2, 8, nullptr, false},      // fewer units than clusters
  };
  uint64_t seed = 9000;
  for (const C& c : cases) {
    if (c.tile) setenv("FLASHOVERLAP_GEMM_TILE", c.tile, 1); else unsetenv("FLASHOVERLAP_GEMM_TILE");
    Problem p({c.m, c.n, c.k}, c.dt, seed += 10, s);
    SignalingGemmArgs a = p.Args(EvenLayout(c.m, c.nb, c.groups, 128), c.comm);
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
  Problem p({512, 512, 512}, B, 77, s, /*with_ref=*/false);
  SignalingGemmArgs a = p.Args(EvenLayout(512, 1, 2, 128), 8);
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

// A benchmark case: per-GPU GEMM, rank blocks (2: a reduce-scatter's layout), groups,
// comm_sms, and the collective's total time at that comm_sms (ms; NCCL capped alone on
// 2 x H200, benchmarks/results/h200x2.json), emulated per group by its rows' share.
struct BenchCase { const char* op; int64_t m, n, k; int nb, groups, comm; double coll_ms; };

std::vector<int64_t> CommNs(const BenchCase& c, const GroupLayout& L, double scale) {
  std::vector<int64_t> ns(L.num_groups);
  const double rows = double(c.m / c.nb);
  for (int g = 0; g < L.num_groups; ++g)
    ns[g] = int64_t(scale * c.coll_ms * 1e6 * (L.band_rows[g + 1] - L.band_rows[g]) / rows);
  return ns;
}

void Bench(cudaStream_t s, int* counters, int iters, double scale) {
  HelperStreams hs;
  CK(cudaFuncSetAttribute(EmulatedCollective, cudaFuncAttributeMaxDynamicSharedMemorySize, kCommSmemBytes));
  const std::vector<BenchCase> cases = {
      {"AR", 4096, 8192, 4096, 1, 6, 16, 0.274},   {"AR", 8192, 8192, 4096, 1, 6, 16, 0.523},
      {"AR", 8192, 28672, 4096, 1, 6, 16, 1.686},  {"AR", 8192, 8192, 14336, 1, 17, 8, 0.761},
      {"AR", 16384, 8192, 8192, 1, 34, 8, 1.450},  {"RS", 8192, 8192, 4096, 2, 6, 16, 0.390},
      {"RS", 8192, 8192, 14336, 2, 16, 8, 0.926},  {"RS", 8192, 8192, 14336, 2, 6, 16, 0.390},
      {"RS", 8192, 28672, 4096, 2, 16, 8, 2.399},  {"RS", 16384, 8192, 8192, 2, 32, 8, 1.927},
  };
  printf("%-3s %-18s %2s %6s %4s %7s | %8s %8s %9s %9s %7s %9s %7s\n", "op", "M x N x K", "nb", "groups", "comm", "coll",
         "comm 0", "comm c", "c + coll", "+ helpers", "gain", "+ whole", "gain");
  uint64_t seed = 12000;
  for (const BenchCase& c : cases) {
    Problem p({c.m, c.n, c.k}, GemmDType::kBFloat16, seed += 10, s, /*with_ref=*/false);
    SignalingGemmArgs a = p.Args(EvenLayout(c.m, c.nb, c.groups, 256), 0);
    a.counters = counters;
    const std::vector<int64_t> comm_ns = CommNs(c, a.layout, scale);
    auto gemm = [&](int comm) {
      SignalingGemmArgs b = a;
      b.comm_sms = comm;
      return std::function<void()>([b, s, counters]() {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        if (LaunchSignalingGemm(b, s) != cudaSuccess) { fprintf(stderr, "%s\n", LastSignalingGemmError()); exit(2); }
      });
    };
    auto overlapped = [&](bool helpers) {
      SignalingGemmArgs b = a;
      b.comm_sms = c.comm;
      return std::function<void()>([b, helpers, &comm_ns, s, &hs, counters]() {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        if (LaunchOverlapped(b, helpers, comm_ns, s, hs) != cudaSuccess) {
          fprintf(stderr, "%s\n", LastSignalingGemmError());
          exit(2);
        }
      });
    };
    // The helpers with whole tails (FLASHOVERLAP_GEMM_TAIL=whole, read at every launch): the
    // split tail is planned for the main grid alone.
    const std::function<void()> helped = overlapped(true);
    const std::function<void()> helped_whole = [helped]() {
      setenv("FLASHOVERLAP_GEMM_TAIL", "whole", 1);
      helped();
      unsetenv("FLASHOVERLAP_GEMM_TAIL");
    };
    const std::vector<float> t =
        TimeInterleaved({gemm(0), gemm(c.comm), overlapped(false), helped, helped_whole}, s, iters);
    overlapped(true)();
    const unsigned units = HelperUnits(s);
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-3s %-18s %2d %6d %4d %7.3f | %8.3f %8.3f %9.3f %9.3f %6.1f%% %9.3f %6.1f%%  (helpers took %u units)\n",
           c.op, shape, c.nb, a.layout.num_groups, c.comm, scale * c.coll_ms, t[0], t[1], t[2], t[3],
           100.0 * (t[2] - t[3]) / t[2], t[4], 100.0 * (t[2] - t[4]) / t[2], units);
    char buf[640];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"bench\",\"op\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"num_blocks\":%d,\"groups\":%d,"
             "\"comm_sms\":%d,\"emulated_collective_ms\":%.4f,\"gemm_comm0_ms\":%.4f,\"gemm_comm_ms\":%.4f,"
             "\"with_collectives_ms\":%.4f,\"with_collectives_and_helpers_ms\":%.4f,"
             "\"with_collectives_and_helpers_whole_tail_ms\":%.4f,\"helper_units_one_call\":%u}",
             c.op, (long long)c.m, (long long)c.n, (long long)c.k, c.nb, a.layout.num_groups, c.comm,
             scale * c.coll_ms, t[0], t[1], t[2], t[3], t[4], units);
    AddJson(buf);
    fflush(stdout);
  }
}

// Helpers with no collective at all: one group, so one helper launch runs beside the whole
// GEMM (as at world size 1). Against comm_sms 0 and comm_sms alone: what the helpers' SMs add,
// and (helper launch 20 us late) whether starting together with the main grid costs it.
void Solo(cudaStream_t s, int* counters, int iters) {
  HelperStreams hs;
  struct C { int64_t m, n, k; int comm; };
  const std::vector<C> cases = {{8192, 8192, 4096, 8},  {8192, 8192, 8192, 8},  {4096, 8192, 8192, 8},
                                {8192, 28672, 8192, 8}, {16384, 8192, 16384, 8}, {8192, 8192, 8192, 16}};
  printf("%-20s %4s | %8s %8s %9s %9s\n", "M x N x K", "comm", "comm 0", "comm c", "+helpers", "+late");
  uint64_t seed = 15000;
  for (const C& c : cases) {
    Problem p({c.m, c.n, c.k}, GemmDType::kBFloat16, seed += 10, s, /*with_ref=*/false);
    SignalingGemmArgs a = p.Args(EvenLayout(c.m, 1, 1, 256), 0);
    a.counters = counters;
    auto run = [&](int comm, bool helpers, int64_t delay_ns) {
      SignalingGemmArgs b = a;
      b.comm_sms = comm;
      b.helpers = helpers;
      b.queue_reset = hs.queue_reset;
      return std::function<void()>([b, helpers, delay_ns, s, &hs, counters]() {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        if (LaunchSignalingGemm(b, s) != cudaSuccess) { fprintf(stderr, "%s\n", LastSignalingGemmError()); exit(2); }
        if (!helpers) return;
        CK(cudaStreamWaitEvent(hs.side, hs.queue_reset, 0));
        if (delay_ns > 0) SleepNs<<<1, 32, 0, hs.side>>>(delay_ns);
        if (LaunchSignalingGemmHelpers(b, 0, hs.side) != cudaSuccess) exit(2);
        CK(cudaEventRecord(hs.side_done, hs.side));
        CK(cudaStreamWaitEvent(s, hs.side_done, 0));
      });
    };
    const std::vector<float> t = TimeInterleaved(
        {run(0, false, 0), run(c.comm, false, 0), run(c.comm, true, 0), run(c.comm, true, 20000)}, s, iters);
    run(c.comm, true, 0)();
    const unsigned units = HelperUnits(s);
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-20s %4d | %8.3f %8.3f %9.3f %9.3f  (helpers took %u units, %d clusters + %d)\n", shape, c.comm, t[0],
           t[1], t[2], t[3], units, LastSignalingGemmLaunch().clusters, LastSignalingGemmLaunch().helper_clusters);
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"solo\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"comm_sms\":%d,\"comm0_ms\":%.4f,"
             "\"comm_ms\":%.4f,\"helpers_ms\":%.4f,\"helpers_late_ms\":%.4f,\"helper_units_one_call\":%u}",
             (long long)c.m, (long long)c.n, (long long)c.k, c.comm, t[0], t[1], t[2], t[3], units);
    AddJson(buf);
    fflush(stdout);
  }
}

// One case's per-group timeline (CUDA events on the side stream, ms after the call's start):
// each helper launch's end, each group's counter complete, each emulated collective's end.
void Timeline(cudaStream_t s, int* counters, double scale) {
  HelperStreams hs;
  CK(cudaFuncSetAttribute(EmulatedCollective, cudaFuncAttributeMaxDynamicSharedMemorySize, kCommSmemBytes));
  for (const BenchCase& c : {BenchCase{"AR", 8192, 8192, 4096, 1, 6, 16, 0.523},
                             BenchCase{"RS", 8192, 8192, 14336, 2, 16, 8, 0.926}}) {
    Problem p({c.m, c.n, c.k}, GemmDType::kBFloat16, 31, s, /*with_ref=*/false);
    SignalingGemmArgs a = p.Args(EvenLayout(c.m, c.nb, c.groups, 256), c.comm);
    a.counters = counters;
    const std::vector<int64_t> comm_ns = CommNs(c, a.layout, scale);
    const int G = a.layout.num_groups;
    std::vector<cudaEvent_t> ev(3 * G + 2);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    for (int run = 0; run < 4; ++run) {  // plain, plain, helpers, helpers: the second of each printed
      const bool helpers = run >= 2;
      CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
      CK(cudaEventRecord(ev[0], s));
      SignalingGemmArgs b = a;
      b.helpers = helpers;
      b.queue_reset = hs.queue_reset;
      if (LaunchSignalingGemm(b, s) != cudaSuccess) { fprintf(stderr, "%s\n", LastSignalingGemmError()); exit(2); }
      CK(cudaEventRecord(ev[1], s));  // GEMM done
      const bool launch_helpers = helpers && LastSignalingGemmLaunch().helper_clusters > 0;
      CK(cudaStreamWaitEvent(hs.side, hs.queue_reset, 0));
      for (int g = 0; g < G; ++g) {
        if (launch_helpers && LaunchSignalingGemmHelpers(b, g, hs.side) != cudaSuccess) exit(2);
        CK(cudaEventRecord(ev[2 + 3 * g], hs.side));
        WaitCounterGeq<<<1, 32, 0, hs.side>>>(counters + g, int(TilesInGroup(b, g)));
        CK(cudaEventRecord(ev[3 + 3 * g], hs.side));
        EmulatedCollective<<<c.comm, 128, kCommSmemBytes, hs.side>>>(comm_ns[g]);
        CK(cudaEventRecord(ev[4 + 3 * g], hs.side));
      }
      CK(cudaDeviceSynchronize());
      if (run % 2 == 0) continue;  // warm-up
      auto elapsed = [&](int i) { float t = 0; CK(cudaEventElapsedTime(&t, ev[0], ev[i])); return t; };
      printf("timeline %s %lldx%lldx%lld nb=%d groups=%d comm=%d coll %.3f ms, helpers %s: GEMM done %.3f, "
             "helpers took %u units; per group: helpers' end / counter complete / collective's end\n",
             c.op, (long long)c.m, (long long)c.n, (long long)c.k, c.nb, G, c.comm, scale * c.coll_ms,
             helpers ? "on" : "off", elapsed(1), helpers ? HelperUnits(s) : 0u);
      for (int g = 0; g < G; ++g)
        printf("    %2d: %.3f / %.3f / %.3f\n", g, elapsed(2 + 3 * g), elapsed(3 + 3 * g), elapsed(4 + 3 * g));
      fflush(stdout);
    }
    for (auto& e : ev) CK(cudaEventDestroy(e));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  std::string json_path;
  int iters = 20;
  double scale = 1.0;
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--comm-scale") && i + 1 < argc) scale = atof(argv[++i]);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if (iters < 1 || !(scale >= 0 && scale < 10)) { fprintf(stderr, "bad --iters / --comm-scale\n"); return 2; }
  TestDevice d = StartTestDevice();
  cudaStream_t s = d.stream;
  int* counters = d.counters;
  // Load the wait kernel now: under lazy loading its first launch would wait for the GEMM.
  WaitCounterGeq<<<1, 32, 0, s>>>(counters, 0);
  CK(cudaStreamSynchronize(s));
  if (mode == "check" || mode == "all" || mode == "sanitize") Check(s, counters, mode == "sanitize");
  if (mode == "bench" || mode == "all") Bench(s, counters, iters, scale);
  if (mode == "timeline") Timeline(s, counters, scale);
  if (mode == "solo") Solo(s, counters, iters);
  char fields[96];
  snprintf(fields, sizeof fields, ",\"iters\":%d,\"comm_scale\":%.3f", iters, scale);
  return FinishTest(d, mode, json_path, fields);
}
