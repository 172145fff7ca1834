// Standalone test + benchmark of the signaling GEMM (not part of the Python extension).
//   gemm_test correctness  : fresh random inputs, poisoned output, fp32 reference, counters, API errors
//   gemm_test signal       : a watcher kernel checks each group as soon as its counter completes
//   gemm_test bench        : CUDA-event timing vs cublasGemmEx (bf16, fp32 accumulation)
//   gemm_test sanitize     : small shapes, for compute-sanitizer memcheck/racecheck/synccheck
//   gemm_test profile      : one shape (--shape MxNxK, --comm C), 5 launches of ours then 5 of
//                            cublasGemmEx, nothing timed: for a profiler (ncu -k ...)
//   gemm_test timeline     : (FO_TIMELINE builds: tests/cuda/build_timeline.sh) one shape, the
//                            clock64 stamps of the first CTAs' warps per piece of work
//   gemm_test all          : correctness + signal + bench
// Options: --json PATH, --iters N (signal runs per case, default 3), --quick.
// Exit code 1 if any check failed.
#include "gemm_test_common.cuh"

std::string LayoutStr(const GroupLayout& L) {
  std::string b = "[";
  for (int g = 0; g <= L.num_groups; ++g) b += std::to_string(L.band_rows[g]) + (g < L.num_groups ? "," : "]");
  return b;
}

// want_split: 1 = the launch must have split its tail, 0 = must not, -1 = either.
void CheckCase(const char* tag, Problem& p, const GroupLayout& L, int comm, int* counters, cudaStream_t s,
               const char* force_tile = nullptr, int want_split = -1) {
  if (force_tile) setenv("FLASHOVERLAP_GEMM_TILE", force_tile, 1); else unsetenv("FLASHOVERLAP_GEMM_TILE");
  SignalingGemmArgs a = p.Args(L, comm);
  const GemmTileShape ts = ChooseTileShape(a);
  RunResult r = RunAndCheck(a, (const float*)p.ref.p, counters, s);
  unsetenv("FLASHOVERLAP_GEMM_TILE");
  const bool split_ok = want_split < 0 || (r.info.split_units > 0) == (want_split == 1);
  const bool pass = r.launch == cudaSuccess && r.bad == 0 && r.wrong == 0 && r.rel_err < 1e-2 && r.counters_ok &&
                    split_ok;
  if (!pass) ++g_failures;
  char buf[768];
  snprintf(buf, sizeof buf,
           "{\"tag\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"dtype\":\"%s\",\"num_blocks\":%d,\"bands\":\"%s\","
           "\"comm_sms\":%d,\"tile\":\"%dx%d c%d\",\"launch\":\"%s\",\"rel_err\":%.3e,\"nonfinite\":%llu,"
           "\"wrong\":%llu,\"clusters\":%d,\"units\":%d,\"split_units\":%d,\"split_chunks\":%d,\"want_split\":%d,"
           "\"counters_ok\":%s,\"pass\":%s}",
           tag, (long long)p.s.m, (long long)p.s.n, (long long)p.s.k, DtName(p.dt), L.num_blocks, LayoutStr(L).c_str(),
           comm, ts.block_m, ts.block_n, ts.cluster_m, cudaGetErrorName(r.launch), r.rel_err, r.bad, r.wrong,
           r.info.clusters, r.info.units, r.info.split_units, r.info.split_chunks, want_split,
           r.counters_ok ? "true" : "false", pass ? "true" : "false");
  AddJson(buf);
  printf("%-6s %-5s %6lldx%6lldx%6lld nb=%d bands=%-28s comm=%2d tile=%dx%d c%d rel_err=%.2e nonfinite=%llu wrong=%llu "
         "units=%d/%d split=%d/%d counters=%s %s\n",
         tag, DtName(p.dt), (long long)p.s.m, (long long)p.s.n, (long long)p.s.k, L.num_blocks, LayoutStr(L).c_str(),
         comm, ts.block_m, ts.block_n, ts.cluster_m, r.rel_err, r.bad, r.wrong, r.info.units, r.info.clusters,
         r.info.split_units, r.info.split_chunks, r.counters_ok ? "ok" : "BAD", pass ? "PASS" : "FAIL");
  fflush(stdout);
}

void ApiChecks(cudaStream_t s) {
  Problem p({256, 256, 64}, GemmDType::kBFloat16, 7, s, false);
  auto expect = [&](const char* what, SignalingGemmArgs a, cudaError_t want) {
    const cudaError_t got = LaunchSignalingGemm(a, s);
    const bool pass = got == want && (want == cudaSuccess || strlen(LastSignalingGemmError()) > 0);
    if (!pass) ++g_failures;
    printf("api    %-34s -> %-22s msg='%s' %s\n", what, cudaGetErrorName(got), got ? LastSignalingGemmError() : "",
           pass ? "PASS" : "FAIL");
    char buf[512];
    snprintf(buf, sizeof buf, "{\"tag\":\"api\",\"what\":\"%s\",\"got\":\"%s\",\"pass\":%s}", what,
             cudaGetErrorName(got), pass ? "true" : "false");
    AddJson(buf);
  };
  GroupLayout L = EvenLayout(256, 1, 2, 128);
  SignalingGemmArgs a = p.Args(L, 0);
  SignalingGemmArgs b = a; b.x = (char*)a.x + 2; expect("misaligned x", b, cudaErrorInvalidValue);
  b = a; b.n = 12; expect("N not multiple of 8", b, cudaErrorInvalidValue);
  b = a; b.layout.band_rows[2] = 200; expect("bands not ending at M/num_blocks", b, cudaErrorInvalidValue);
  b = a; b.layout.num_blocks = 3; expect("M not multiple of num_blocks", b, cudaErrorInvalidValue);
  b = a; b.layout.num_groups = 0; expect("num_groups 0", b, cudaErrorInvalidValue);
  b = a; b.comm_sms = 100000; expect("comm_sms too large", b, cudaErrorInvalidValue);
  b = a; b.counters = nullptr; expect("no counters (no signal)", b, cudaSuccess);
  b = a; b.queue = (char*)a.queue + 8; expect("misaligned tile queue", b, cudaErrorInvalidValue);
  b = a; b.queue = nullptr; expect("no tile queue (round robin)", b, cudaSuccess);
  // A switch's typo is refused (not read as its default); the caller's setting is restored.
  auto expect_typo = [&](const char* name, const char* typo) {
    const char* set = getenv(name);
    const std::string saved = set ? set : "";
    setenv(name, typo, 1);
    expect((std::string(name) + " typo").c_str(), a, cudaErrorInvalidValue);
    if (set) setenv(name, saved.c_str(), 1); else unsetenv(name);
  };
  expect_typo("FLASHOVERLAP_GEMM_QUEUE", "dynamc");
  expect_typo("FLASHOVERLAP_GEMM_TAIL", "spilt");
  expect_typo("FLASHOVERLAP_GEMM_SCHEDULE", "ping-pong");
  expect_typo("FLASHOVERLAP_GEMM_EPILOGUE", "halfs");
  CK(cudaStreamSynchronize(s));
}

void SplitTail(bool quick, int* counters, cudaStream_t s, uint64_t seed);

void Correctness(bool quick, int* counters, cudaStream_t s) {
  ApiChecks(s);
  uint64_t seed = 1000;
  int i = 0;
  for (const Shape3& sh : kDesignShapes) {
    if (quick && i++ > 0) break;
    {
      Problem p(sh, GemmDType::kBFloat16, seed += 10, s);
      CheckCase("design", p, EvenLayout(sh.m, 1, 4, 256), 0, counters, s);
      CheckCase("design", p, EvenLayout(sh.m, 2, 3, 256), 8, counters, s);
      CheckCase("design", p, EvenLayout(sh.m, 1, 1, 256), 16, counters, s);
      if (sh.m == 8192 && sh.n == 8192 && sh.k == 4096)
        CheckCase("design", p, EvenLayout(sh.m, 1, 4, 128), 0, counters, s, "128");
    }
    {
      Problem p(sh, GemmDType::kFloat16, seed += 10, s);
      CheckCase("design", p, EvenLayout(sh.m, 4, 2, 256), 0, counters, s);
    }
  }
  // Odd shapes: partial tiles in M, N and K, bands not aligned to tiles, idle cluster partners.
  struct Odd { Shape3 s; GemmDType dt; int nb; std::vector<int> bands; int comm; const char* tile; };
  const GemmDType B = GemmDType::kBFloat16, H = GemmDType::kFloat16;
  const std::vector<Odd> odd = {
      {{1, 8, 8}, B, 1, {0, 1}, 0, nullptr},
      {{1, 7168, 1000}, H, 1, {0, 1}, 8, nullptr},
      {{1, 8, 1000}, B, 1, {0, 1}, 16, "256"},
      {{127, 8, 1000}, H, 1, {0, 50, 127}, 0, nullptr},
      {{127, 7168, 1000}, B, 1, {0, 50, 127}, 8, nullptr},
      {{127, 7168, 1000}, H, 1, {0, 127}, 16, "256"},
      {{5000, 8, 1000}, B, 2, {0, 700, 1800, 2500}, 0, nullptr},
      {{5000, 8, 1000}, H, 1, {0, 1000, 2100, 3333, 4096, 5000}, 8, "256"},
      {{5000, 7168, 1000}, B, 1, {0, 1000, 2100, 3333, 4096, 5000}, 16, nullptr},
      {{5000, 7168, 1000}, H, 2, {0, 700, 1800, 2500}, 0, nullptr},
      {{5000, 7168, 1000}, B, 4, {0, 256, 1250}, 8, nullptr},
      {{5000, 7168, 1000}, H, 4, {0, 300, 1250}, 16, "128"},
      {{5000, 7168, 8}, B, 2, {0, 2500}, 0, nullptr},
  };
  for (const Odd& o : odd) {
    Problem p(o.s, o.dt, seed += 10, s);
    CheckCase("odd", p, MakeLayout(o.s.m, o.nb, o.bands), o.comm, counters, s, o.tile);
  }
  SplitTail(quick, counters, s, seed);
}

// The split tail (tile_schedule.h: PlanSplitTail): cases that must split, across tile
// shapes, last-wave fill, K (16 K tiles, a partial last K tile), rank blocks, idle cluster
// partners in the split units, and the all-gather extensions' row rotation; and the same
// problem with FLASHOVERLAP_GEMM_TAIL=whole, which must not split.
void SplitTail(bool quick, int* counters, cudaStream_t s, uint64_t seed) {
  if (getenv("FLASHOVERLAP_GEMM_QUEUE") && !strcmp(getenv("FLASHOVERLAP_GEMM_QUEUE"), "static")) {
    printf("split  (skipped: FLASHOVERLAP_GEMM_QUEUE=static never splits)\n");
    return;
  }
  struct Sp { Shape3 s; GemmDType dt; int nb; std::vector<int> bands; int comm; const char* tile; };
  const GemmDType B = GemmDType::kBFloat16, H = GemmDType::kFloat16;
  std::vector<Sp> cases = {
      {{8192, 8192, 1024}, B, 1, {0, 2048, 8192}, 0, nullptr},       // 1024 units / 66: R 34
      {{4096, 8192, 4096}, B, 1, {0, 1024, 4096}, 8, nullptr},       // 512 / 62: R 16
      {{8192, 8192, 4096}, H, 2, {0, 1024, 4096}, 16, nullptr},      // 1024 / 58: R 38, 2 rank blocks
      {{5000, 7168, 1000}, B, 1, {0, 1000, 2100, 3333, 4096, 5000}, 16, nullptr},  // idle partners, K 1000
      {{8192, 8192, 1536}, H, 1, {0, 8192}, 0, "128"},               // 128x128: 4096 / 132: R 4
      {{3000, 2048, 2112}, B, 1, {0, 1500, 3000}, 112, "256"},       // 96 units on 10 clusters (ping-pong: 192)
  };
  if (quick) cases.resize(2);
  for (const Sp& c : cases) {
    Problem p(c.s, c.dt, seed += 10, s);
    const GroupLayout L = MakeLayout(c.s.m, c.nb, c.bands);
    CheckCase("split", p, L, c.comm, counters, s, c.tile, 1);
    setenv("FLASHOVERLAP_GEMM_TAIL", "whole", 1);
    CheckCase("whole", p, L, c.comm, counters, s, c.tile, 0);
    unsetenv("FLASHOVERLAP_GEMM_TAIL");
  }
}

// ---------------------------------------------------------------- signal visibility
void SignalTest(bool quick, int iters, int* counters, cudaStream_t s) {
  cudaStream_t s_watch;
  CK(cudaStreamCreateWithFlags(&s_watch, cudaStreamNonBlocking));
  struct Sig { Shape3 s; int nb, groups, comm; };
  std::vector<Sig> cases = {{{8192, 8192, 4096}, 1, 4, 16}, {{8192, 8192, 4096}, 2, 4, 16},
                            {{16384, 8192, 8192}, 1, 4, 16}, {{8192, 8192, 4096}, 1, 4, 8}};
  if (quick) cases.resize(2);
  uint64_t seed = 5000;
  for (const Sig& c : cases) {
    Problem p(c.s, GemmDType::kBFloat16, seed += 10, s);
    const GroupLayout L = EvenLayout(c.s.m, c.nb, c.groups, 256);
    SignalingGemmArgs a = p.Args(L, c.comm);
    a.counters = counters;
    const std::vector<int> dst = DstRows(c.s.m, L);
    std::vector<int> src(dst.size());
    for (size_t r = 0; r < dst.size(); ++r) src[dst[r]] = int(r);
    std::vector<int> expected(L.num_groups), row0(L.num_groups + 1);
    for (int g = 0; g < L.num_groups; ++g) expected[g] = int(TilesInGroup(a, g));
    for (int g = 0; g <= L.num_groups; ++g) row0[g] = L.num_blocks * L.band_rows[g];
    Buf d_src(src.size() * 4), d_exp(expected.size() * 4), d_row0(row0.size() * 4), d_res(sizeof(WatchOut));
    CK(cudaMemcpy(d_src.p, src.data(), src.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_exp.p, expected.data(), expected.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_row0.p, row0.data(), row0.size() * 4, cudaMemcpyHostToDevice));
    // One plain launch first: the first launch of a kernel loads its module (lazy loading),
    // and that load waits for running kernels, i.e. for the spinning watcher (seen: 10 s
    // watcher time-outs on the first iteration when this was missing).
    if (LaunchSignalingGemm(a, s) != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); exit(2); }
    CK(cudaDeviceSynchronize());
    WatchOut total{};
    for (int it = 0; it < iters; ++it) {
      CK(cudaMemset(a.out, 0xFF, size_t(a.m) * a.n * 2));
      CK(cudaMemset(counters, 0, sizeof(int) * kMaxGroups));
      CK(cudaMemset(d_res.p, 0, sizeof(WatchOut)));
      CK(cudaDeviceSynchronize());
      // Watcher first so its few blocks are resident before the GEMM fills the machine.
      Watcher<<<L.num_groups, 1024, 0, s_watch>>>(counters, (int*)d_exp.p, L.num_groups, (int*)d_row0.p,
                                                  (const __nv_bfloat16*)a.out, (const float*)p.ref.p,
                                                  (int*)d_src.p, int(a.n), (WatchOut*)d_res.p);
      CK(cudaGetLastError());
      const cudaError_t e = LaunchSignalingGemm(a, s);
      if (e != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); exit(2); }
      CK(cudaDeviceSynchronize());
      WatchOut h;
      CK(cudaMemcpy(&h, d_res.p, sizeof h, cudaMemcpyDeviceToHost));
      total.unwritten += h.unwritten; total.wrong += h.wrong;
      total.timed_out += h.timed_out; total.seen_early += h.seen_early;
    }
    const bool pass = total.unwritten == 0 && total.wrong == 0 && total.timed_out == 0;
    if (!pass) ++g_failures;
    printf("signal bf16 %6lldx%6lldx%6lld nb=%d groups=%d comm=%2d x%d: unwritten=%llu wrong=%llu timed_out=%d "
           "groups_checked_while_gemm_running=%d/%d %s\n",
           (long long)c.s.m, (long long)c.s.n, (long long)c.s.k, c.nb, L.num_groups, c.comm, iters, total.unwritten,
           total.wrong, total.timed_out, total.seen_early, iters * L.num_groups, pass ? "PASS" : "FAIL");
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"signal\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"num_blocks\":%d,\"groups\":%d,\"comm_sms\":%d,"
             "\"runs\":%d,\"unwritten\":%llu,\"wrong\":%llu,\"timed_out\":%d,\"groups_checked_while_running\":%d,"
             "\"groups_checked\":%d,\"pass\":%s}",
             (long long)c.s.m, (long long)c.s.n, (long long)c.s.k, c.nb, L.num_groups, c.comm, iters, total.unwritten,
             total.wrong, total.timed_out, total.seen_early, iters * L.num_groups, pass ? "true" : "false");
    AddJson(buf);
    fflush(stdout);
  }
  CK(cudaStreamDestroy(s_watch));
}

// ---------------------------------------------------------------- timing
// Variants are interleaved: each round times a batch of launches of every variant in turn
// (every other round in reverse order), so clock and temperature drift hits all of them alike (a run of 40 launches of one
// variant, then of the next, showed 3-13% differences between identical schedules).
// Reported: the median over rounds of the per-launch mean of a batch.
struct Variant {
  std::string name;
  int comm, groups, panel;  // panel 0: launcher default
  bool signal, is_cublas;
  std::vector<float> ms;
  bool whole = false;  // FLASHOVERLAP_GEMM_TAIL=whole (no split tail)
  bool pingpong = false;  // FLASHOVERLAP_GEMM_SCHEDULE=pingpong (128x128 ping-pong kernel)
};

void Bench(bool quick, Cublas& cublas, int* counters, cudaStream_t s) {
  std::string table;
  int shape_i = 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Shape3& sh : kDesignShapes) {
    if (quick && shape_i++ > 0) break;
    const int kSets = 3;  // rotating inputs: 3 sets, each well over the 60 MB L2
    std::vector<Problem*> sets;
    for (int k = 0; k < kSets; ++k) sets.push_back(new Problem(sh, GemmDType::kBFloat16, 900 + k, s, false));
    const double flop = 2.0 * sh.m * sh.n * sh.k;
    std::vector<Variant> vs;
    if (cublas.ok()) vs.push_back({"cublas", 0, 0, 0, false, true, {}});
    vs.push_back({"g4 sig", 0, 4, 0, true, false, {}});
    vs.push_back({"g1 sig", 0, 1, 0, true, false, {}});
    vs.push_back({"g4 nosig", 0, 4, 0, false, false, {}});
    vs.push_back({"g4 sig p16", 0, 4, 16, true, false, {}});
    vs.push_back({"g4 sig p4", 0, 4, 4, true, false, {}});
    for (int comm : {4, 8, 12, 16}) vs.push_back({"g4 sig", comm, 4, 0, true, false, {}});
    for (int comm : {0, 8, 16}) vs.push_back({"g4 sig whole", comm, 4, 0, true, false, {}, true});
    for (int comm : {0, 8, 16}) vs.push_back({"pp g4 sig", comm, 4, 0, true, false, {}, false, true});
    vs.push_back({"pp g4 sig whole", 0, 4, 0, true, false, {}, true, true});
    int launch_no = 0;
    auto launch = [&](const Variant& v) {
      Problem* p = sets[launch_no++ % kSets];
      if (v.is_cublas) {
        if (cublas.Run(p->x.p, p->w.p, p->out.p, int(sh.m), int(sh.n), int(sh.k), GemmDType::kBFloat16, s) != 0) {
          fprintf(stderr, "cublasGemmEx failed\n"); exit(2);
        }
        return;
      }
      SignalingGemmArgs a = p->Args(EvenLayout(sh.m, 1, v.groups, 256), v.comm);
      a.counters = v.signal ? counters : nullptr;
      if (LaunchSignalingGemm(a, s) != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); exit(2); }
    };
    const int kRounds = 12, kBatch = 4;
    for (int round = -1; round < kRounds; ++round) {  // round -1: warm-up
      // Every other round backwards: a variant's place in the round biased it by up to ~3%
      // (two identical launches, one early and one late in each round).
      for (size_t vi = 0; vi < vs.size(); ++vi) {
        Variant& v = vs[(round & 1) ? vs.size() - 1 - vi : vi];
        if (v.panel > 0) setenv("FLASHOVERLAP_GEMM_PANEL", std::to_string(v.panel).c_str(), 1);
        else unsetenv("FLASHOVERLAP_GEMM_PANEL");
        if (v.whole) setenv("FLASHOVERLAP_GEMM_TAIL", "whole", 1);
        else unsetenv("FLASHOVERLAP_GEMM_TAIL");
        if (v.pingpong) setenv("FLASHOVERLAP_GEMM_SCHEDULE", "pingpong", 1);
        else unsetenv("FLASHOVERLAP_GEMM_SCHEDULE");
        // Counters are reset once per batch; they only grow, and the kernel never reads them.
        if (v.signal) CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        CK(cudaEventRecord(e0, s));
        for (int b = 0; b < kBatch; ++b) launch(v);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (round >= 0) v.ms.push_back(ms / kBatch);
      }
    }
    unsetenv("FLASHOVERLAP_GEMM_PANEL");
    unsetenv("FLASHOVERLAP_GEMM_TAIL");
    unsetenv("FLASHOVERLAP_GEMM_SCHEDULE");
    auto median = [](std::vector<float> t) { std::sort(t.begin(), t.end()); return t[t.size() / 2]; };
    const float t_cublas = cublas.ok() ? median(vs[0].ms) : -1.f;
    for (const Variant& v : vs) {
      const float t = median(v.ms);
      const float lo = *std::min_element(v.ms.begin(), v.ms.end()), hi = *std::max_element(v.ms.begin(), v.ms.end());
      const double ratio = t_cublas > 0 ? t_cublas / t : 0;
      char buf[640];
      snprintf(buf, sizeof buf,
               "{\"tag\":\"bench\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"dtype\":\"bf16\",\"variant\":\"%s\",\"comm_sms\":%d,"
               "\"groups\":%d,\"signal\":%s,\"panel\":%d,\"tail\":\"%s\",\"schedule\":\"%s\",\"ms\":%.4f,\"ms_min\":%.4f,\"ms_max\":%.4f,\"tflops\":%.1f,"
               "\"cublas_ms\":%.4f,\"cublas_over_ours\":%.3f}",
               (long long)sh.m, (long long)sh.n, (long long)sh.k, v.name.c_str(), v.comm, v.groups,
               v.signal ? "true" : "false", v.is_cublas ? 0 : (v.panel ? v.panel : 8), v.whole ? "whole" : "split",
               v.pingpong ? "pingpong" : "cooperative", t, lo, hi, flop / t * 1e-9,
               t_cublas, ratio);
      AddJson(buf);
      char line[256];
      snprintf(line, sizeof line,
               "%6lldx%6lldx%6lld  %-13s comm=%2d  %.3f ms [%.3f-%.3f] (%4.0f TF/s)  cublas %.3f ms  ratio %.3f\n",
               (long long)sh.m, (long long)sh.n, (long long)sh.k, v.name.c_str(), v.comm, t, lo, hi,
               flop / t * 1e-9, t_cublas, ratio);
      table += line;
    }
    for (Problem* p : sets) delete p;
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  printf("\n==== bench (bf16; median over 12 interleaved rounds of 4-launch batches [min-max]; rotating inputs;\n"
         "     ratio = cuBLAS time / our time; default panel 8; gN = N groups; sig = counters on) ====\n%s",
         table.c_str());
}

// Launches only (a profiler times them): ours at comm_sms `comm` (4 groups, signals on), then
// cublasGemmEx, 5 each on one input set.
void Profile(const Shape3& sh, int comm, Cublas& cublas, int* counters, cudaStream_t s) {
  Problem p(sh, GemmDType::kBFloat16, 901, s, false);
  for (int i = 0; i < 5; ++i) {
    SignalingGemmArgs a = p.Args(EvenLayout(sh.m, 1, 4, 256), comm);
    a.counters = counters;
    CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
    if (LaunchSignalingGemm(a, s) != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); exit(2); }
  }
  for (int i = 0; i < 5 && cublas.ok(); ++i) {
    if (cublas.Run(p.x.p, p.w.p, p.out.p, int(sh.m), int(sh.n), int(sh.k), GemmDType::kBFloat16, s) != 0) {
      fprintf(stderr, "cublasGemmEx failed\n"); exit(2);
    }
  }
  CK(cudaStreamSynchronize(s));
  printf("profile %lldx%lldx%lld comm=%d: 5 + %d launches\n", (long long)sh.m, (long long)sh.n, (long long)sh.k,
         comm, cublas.ok() ? 5 : 0);
}

#ifdef FO_TIMELINE
// Where the tile boundaries' time goes: per piece, the first CTAs' consumer / producer /
// copy-out stamps (signaling_gemm_kernel.cuh: FO_STAMP), as cycle differences.
void Timeline(const Shape3& sh, int comm, int* counters, cudaStream_t s) {
  Problem p(sh, GemmDType::kBFloat16, 901, s, false);
  const size_t n = size_t(kTimelineCtas) * kTimelineRoles * kTimelinePieces * kTimelineEvents;
  Buf tl(n * 8);
  for (int i = 0; i < 3; ++i) {
    SignalingGemmArgs a = p.Args(EvenLayout(sh.m, 1, 4, 256), comm);
    a.counters = counters;
    a.timeline = i == 2 ? static_cast<long long*>(tl.p) : nullptr;
    CK(cudaMemsetAsync(tl.p, 0, n * 8, s));
    CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
    if (LaunchSignalingGemm(a, s) != cudaSuccess) { fprintf(stderr, "launch: %s\n", LastSignalingGemmError()); exit(2); }
  }
  std::vector<long long> h(n);
  CK(cudaMemcpyAsync(h.data(), tl.p, n * 8, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  auto at = [&](int cta, int role, int piece, int ev) {
    return h[((size_t(cta) * kTimelineRoles + role) * kTimelinePieces + piece) * kTimelineEvents + ev];
  };
  const GemmLaunchInfo info = LastSignalingGemmLaunch();
  printf("timeline %lldx%lldx%lld comm=%d: %d clusters, %d units, split %d/%d; cycles since the CTA's first stamp\n",
         (long long)sh.m, (long long)sh.n, (long long)sh.k, comm, info.clusters, info.units, info.split_units,
         info.split_chunks);
  for (int cta = 0; cta < kTimelineCtas; ++cta) {
    const long long t0 = at(cta, 1, 0, 0);
    printf("cta %d  (consumer: next-piece wait | mma issue | mma tail | epilogue | boundary = tail end -> next mma;"
           "  producer: claim | decode | publish | loads; copy-out: wait staged | copy | signal)\n", cta);
    for (int pc = 0; pc < kTimelinePieces; ++pc) {
      if (at(cta, 0, pc, 1) == 0) break;
      const long long c0 = at(cta, 0, pc, 0), c1 = at(cta, 0, pc, 1), c2 = at(cta, 0, pc, 2), c3 = at(cta, 0, pc, 3),
                      c4 = at(cta, 0, pc, 4), cn = at(cta, 0, pc + 1, 1);
      const long long p0 = at(cta, 1, pc, 0), p1 = at(cta, 1, pc, 1), p2 = at(cta, 1, pc, 2), p3 = at(cta, 1, pc, 3),
                      p4 = at(cta, 1, pc, 4);
      const long long o0 = at(cta, 2, pc, 0), o1 = at(cta, 2, pc, 1), o2 = at(cta, 2, pc, 2), o3 = at(cta, 2, pc, 3);
      printf("  %2d  start %9lld | %6lld %7lld %6lld %6lld | bnd %6lld || prod start %9lld: %6lld %6lld %6lld %7lld"
             " || copy %9lld: %7lld %6lld %6lld\n",
             pc, c1 - t0, c1 - c0, c2 - c1, c3 - c2, c4 ? c4 - c3 : -1, cn ? cn - c3 : -1, p0 ? p0 - t0 : -1,
             p1 - p0, p4 - p1, p2 - p4, p3 - p2, o0 ? o0 - t0 : -1, o1 - o0, o2 - o1, o3 - o2);
    }
  }
}
#endif

void Sanitize(int* counters, cudaStream_t s) {
  struct C { Shape3 s; GemmDType dt; int nb; std::vector<int> bands; const char* tile; int comm, split; };
  const std::vector<C> cs = {{{300, 264, 200}, GemmDType::kBFloat16, 2, {0, 50, 100, 150}, "256", 0, 0},
                             {{300, 264, 200}, GemmDType::kFloat16, 2, {0, 50, 100, 150}, "128", 0, 0},
                             {{1, 8, 8}, GemmDType::kBFloat16, 1, {0, 1}, "256", 0, 0},
                             {{130, 136, 72}, GemmDType::kFloat16, 1, {0, 70, 130}, nullptr, 0, 0},
                             // split tail (partial tiles between chunks), both tile shapes: 4 units
                             // on 3 clusters (comm_sms leaves 6 / 3 SMs), 16 K tiles
                             {{1024, 256, 1024}, GemmDType::kBFloat16, 1, {0, 512, 1024}, "256", 126, 1},
                             {{512, 128, 1000}, GemmDType::kFloat16, 1, {0, 512}, "128", 129, 1},
                             // several whole tiles per CTA (8 K tiles: no split)
                             {{1024, 256, 512}, GemmDType::kBFloat16, 1, {0, 512, 1024}, "256", 126, 0}};
  uint64_t seed = 77;
  const char* queue = getenv("FLASHOVERLAP_GEMM_QUEUE");
  const char* tail = getenv("FLASHOVERLAP_GEMM_TAIL");
  const bool can_split = !(queue && !strcmp(queue, "static")) && !(tail && !strcmp(tail, "whole"));
  for (const C& c : cs) {
    Problem p(c.s, c.dt, seed += 10, s);
    CheckCase("sanit", p, MakeLayout(c.s.m, c.nb, c.bands), c.comm, counters, s, c.tile,
              c.split && can_split ? 1 : -1);
  }
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  std::string json_path;
  bool quick = false;
  int iters = 3, comm = 0;
  Shape3 shape = kDesignShapes[1];
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!strcmp(argv[i], "--comm") && i + 1 < argc) comm = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
      long long m, n, k;
      if (sscanf(argv[++i], "%lldx%lldx%lld", &m, &n, &k) != 3) { fprintf(stderr, "--shape MxNxK\n"); return 2; }
      shape = {m, n, k};
    }
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = true;
  }
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* counters;
  CK(cudaMalloc(&counters, sizeof(int) * kMaxGroups));
  Cublas cublas;
  if (mode == "bench" || mode == "all" || mode == "profile") cublas.Load();

  if (mode == "correctness" || mode == "all") Correctness(quick, counters, s);
  if (mode == "signal" || mode == "all") SignalTest(quick, iters, counters, s);
  if (mode == "bench" || mode == "all") Bench(quick, cublas, counters, s);
  if (mode == "sanitize") Sanitize(counters, s);
  if (mode == "profile") Profile(shape, comm, cublas, counters, s);
#ifdef FO_TIMELINE
  if (mode == "timeline") Timeline(shape, comm, counters, s);
#endif
  CK(cudaDeviceSynchronize());

  if (!json_path.empty()) {
    FILE* f = fopen(json_path.c_str(), "w");
    if (f) {
      fprintf(f, "{\"mode\":\"%s\",\"device\":\"%s\",\"sms\":%d,\"failures\":%d,\"cublas\":%s,\"results\":[\n%s\n]}\n",
              mode.c_str(), prop.name, prop.multiProcessorCount, g_failures, cublas.ok() ? "true" : "false",
              g_json_cases.c_str());
      fclose(f);
    }
  }
  printf("%s: %d failure(s)\n", mode.c_str(), g_failures);
  CK(cudaFree(counters));
  return g_failures ? 1 : 0;
}
