// Standalone test + benchmark of the peer-store reduction: the signaling GEMM's reduction in
// the epilogue and its mirror stores (SignalingGemmArgs::add_from, mirror_slots) and the
// two-rank sequence that uses them (xla_ffi/comm/peer_reduce.h). One GPU:
//   peer_reduce_test flags    : one GEMM whose partials arrive late (the host waits, then a
//                               copy lands them and stream writes complete their counters):
//                               the output must be right; and the control without counters,
//                               which must read the poisoned partials (the check can fail)
//   peer_reduce_test check    : per case, one rank as its own peer (2 calls), then two ranks
//                               emulated on one GPU (each rank's GEMMs on half of the SMs,
//                               comm_sms = SMs / 2; "peer memory" is the same device's),
//                               reduce-scatter and all-reduce, 4 calls back to back with fresh
//                               inputs each, results poisoned first: against the fp32
//                               reference of x0 @ w0 + x1 @ w1, and bit for bit against
//                               round(round(P0) + round(P1)) from two plain GEMMs of the same
//                               geometry (what NCCL's sum of the rounded partials gives);
//                               odd calls load the partials one chunk at a time (add_serial),
//                               even ones through the add ring where the tile has one
//                               (128x256; FLASHOVERLAP_GEMM_TILE=256 forces it on small cases)
//   peer_reduce_test groups   : groups of 3, 4 and 8 ranks emulated on one GPU (each rank's
//                               GEMMs on SMs / world), as `check`'s emulated pair: every
//                               result against float32 and bit for bit against the ring's
//                               rounded running sum of the ranks' plain GEMMs (block b: rank
//                               b - 1's product, to which b - 2, ..., b + 1, b each add theirs
//                               and round; docs/DESIGN.md, "Ring reduction")
//   peer_reduce_test bench    : one rank on the whole GPU (comm_sms 0) with itself as its peer
//                               (its peer stores land in its own memory: everything a real
//                               pair does but NVLink's bandwidth and latency): our GEMM,
//                               cuBLAS, our GEMM in the sequence's 16 rotated groups, then the
//                               reduce-scatter and all-reduce sequences with 2 and 8 bands
//                               per block, and with 2 bands and add_serial (the add ring's
//                               A/B) (CUDA events, interleaved, median of --iters samples of
//                               5 calls)
//   peer_reduce_test bench_groups : per shape, our GEMM alone and the RS / AR sequences of a
//                               group of 2, 4 and 8 whose every rank is this one (all its
//                               stores land here: the cost of the ring's adds and the
//                               all-reduce's mirrors in the epilogue, NVLink aside; timing
//                               only beyond 2), interleaved as `bench`
//   peer_reduce_test bench_ring : per shape, groups of 2, 4 and 8 separate ranks at once, each
//                               on its own stream and SMs / world: their RS / AR sequences
//                               against as many plain GEMMs on the same shares (the ring's
//                               real data flow and waits; 3 calls per sample)
//   peer_reduce_test sanitize : flags + the small case with the rank as its own peer, and a
//                               group of 4 that is this rank (no two kernels need to run at
//                               once: compute-sanitizer may serialize)
//   peer_reduce_test abort    : a peer that never comes: rank 0 calls, rank 1 never does; its
//                               GEMM must still be waiting after 1 s (the control), then, once
//                               the host sets the abort flag (host-mapped, as the watchdog's),
//                               fail (trap) within 10 s instead of waiting for ever. Leaves the
//                               CUDA context unusable: run alone, last
//   peer_reduce_test wait_wrap: the stream waits across the wrap of int32 (both methods): a
//                               word at INT32_MAX must keep a wait for INT32_MIN waiting
//                               until written, one at INT32_MIN + 5 must pass INT32_MAX - 5
//   peer_reduce_test write_methods: flag writes by each method land after the work before
//                               them, and JAX_FLASHOVERLAP_WAIT picks the method
//                               (stream_word_checks.cuh)
//   peer_reduce_test break    : a rank whose call failed: two ranks emulated on one GPU (half
//                               of the SMs each), call 1 by both, then rank 0's calls 2 and 3
//                               while rank 1 breaks the pair (EnqueueBreakPeers, what the
//                               handler does on a failure) instead of calling: rank 0 must
//                               still wait after 1 s without it, end within 10 s of it with no
//                               CUDA error, and the GPU must stay usable (a plain GEMM after
//                               it right); reduce-scatter and all-reduce
// Options: --json PATH, --iters N (bench, default 15), --first-call N (every rank starts as if
// N calls had run: 2147483645 makes check's and break's calls cross the wrap of the call
// numbers). Exit code 1 if a check failed.
#include "peer_reduce_common.cuh"
#include "stream_word_checks.cuh"

namespace {

// ------------------------------------------------------------------ flags (one GEMM)

// out = x @ w + a partial that arrives late (poisoned until then), each group's counter
// completed after it by a stream write. with_counters false: the control, which does not
// wait and must read poison.
Verdict LatePartials(bool with_counters, int64_t delay_ns, int* counters, cudaStream_t s, cudaStream_t side) {
  const Shape3 sh{1024, 768, 512};
  const GemmDType dt = GemmDType::kBFloat16;
  Problem p(sh, dt, with_counters ? 4242 : 4343, s);
  const int64_t elems = sh.m * sh.n;
  Buf partial(elems * 2), landing(elems * 2), arrived(4 * kMaxGroups);
  Fill(partial.p, elems, dt, with_counters ? 777 : 778, s);
  AddToRef<<<1024, 256, 0, s>>>((const __nv_bfloat16*)partial.p, (float*)p.ref.p, elems);
  CK(cudaGetLastError());
  CK(cudaMemsetAsync(landing.p, 0xFF, elems * 2, s));  // NaN until the copy lands
  CK(cudaMemsetAsync(arrived.p, 0, 4 * kMaxGroups, s));
  SignalingGemmArgs a = p.Args(EvenLayout(sh.m, 1, 4, 256), 0);
  a.counters = counters;
  a.add_from = landing.p;
  a.add_sources = 1;
  a.add_counters = with_counters ? (const int32_t*)arrived.p : nullptr;
  CK(cudaMemsetAsync(a.out, 0xFF, elems * 2, s));
  CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
  CK(cudaStreamSynchronize(s));
  MustLaunch(LaunchSignalingGemm(a, s), "GEMM with late partials");
  // Late, from the host: beside the GEMM only a copy and stream writes. The copy may run as a
  // kernel (tests/cuda/copy_engine_probe: same-device copies need an SM); this GEMM's 48
  // tiles leave most SMs free for it.
  usleep(useconds_t(delay_ns / 1000));
  CK(cudaMemcpyAsync(landing.p, partial.p, elems * 2, cudaMemcpyDeviceToDevice, side));
  for (int g = 0; g < a.layout.num_groups; ++g)
    Must(EnqueueWriteFlag(side, (int32_t*)arrived.p + g, int32_t(TilesInGroup(a, g)), ChosenWriteMethod()), "counter write");
  CK(cudaStreamSynchronize(side));
  CK(cudaStreamSynchronize(s));
  return Compare(a.out, (const float*)p.ref.p, sh.m, sh.n, dt, s);
}

// delay_ms: how late the partials land; long enough that the control's GEMM has read them
// before (20 ms; 2 s under a sanitizer, whose GEMM takes longer than 20 ms).
void Flags(int* counters, cudaStream_t s, int delay_ms) {
  cudaStream_t side;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const Verdict ok = LatePartials(true, delay_ms * 1000000ll, counters, s, side);
  const Verdict control = LatePartials(false, delay_ms * 1000000ll, counters, s, side);
  const bool pass_ok = ok.bad == 0 && ok.wrong == 0 && ok.rel_err < 1e-2;
  const bool pass_control = control.bad > 0;  // the GEMM ran ahead of the late partials
  printf("flags: partials %d ms late, with counters: rel %.2e, unwritten/NaN %llu, off %llu  %s\n", delay_ms,
         ok.rel_err, ok.bad, ok.wrong, pass_ok ? "PASS" : "FAIL");
  printf("flags: control without counters: NaN %llu (must be > 0: the check sees a GEMM that did not wait)  %s\n",
         control.bad, pass_control ? "PASS" : "FAIL");
  g_failures += !pass_ok + !pass_control;
  char buf[320];
  snprintf(buf, sizeof buf,
           "{\"tag\":\"flags\",\"rel_err\":%.3e,\"bad\":%llu,\"wrong\":%llu,\"control_bad\":%llu,\"control_wrong\":%llu,"
           "\"pass\":%s}",
           ok.rel_err, ok.bad, ok.wrong, control.bad, control.wrong, pass_ok && pass_control ? "true" : "false");
  AddJson(buf);
  CK(cudaStreamDestroy(side));
}

// One rank of a pair whose peer is itself (its stores for the other rank land in its own
// recv): the whole sequence with no second rank, so no two kernels need to run at once
// (compute-sanitizer). Its own block adds the other block's product: the result's block 0 is
// x[block 0] @ w + x[block 1] @ w (an all-reduce's mirror stores land on those same rows; its
// block 1 is the other rank's to write: none here). Only a pair: in a ring of more, what a
// rank adds at queue position d is what its next rank stored at d - 1, another block than the
// one it stored itself at d - 1 (BenchGroups times such a rank, unchecked; CheckGroups checks
// groups of separate ranks).
void SelfPeerCase(const Case& c, PeerReduceKind kind, int calls, cudaStream_t s) {
  constexpr int world = 2;
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int64_t rows = c.m / world, out_rows = ar ? c.m : rows, block = rows * c.n;
  EmulatedRank self(0, rows, c.n, -1, world);
  for (int i = 1; i < world; ++i) self.PeerWith(self, i);
  Problem p({c.m, c.n, c.k}, c.dt, 50000 + c.m, s);
  Buf results(calls * out_rows * c.n * 2), prod(c.m * c.n * 2), exact(block * 2), sum_ref(block * 4);
  CK(cudaMemsetAsync(results.p, 0xFF, calls * out_rows * c.n * 2, s));
  SignalingGemmArgs g = p.base;
  g.comm_sms = SelfCommSms();
  g.layout = BandLayout(c.bands);
  g.queue = self.queue->p;
  bool split = false;  // as in CheckCase
  for (int i = 0; i < calls; ++i) {
    g.add_serial = i % 2 == 1;
    Must(EnqueuePeerReduce(self.r, s, kind, g, static_cast<char*>(results.p) + i * out_rows * c.n * 2), "EnqueuePeerReduce");
    split = split || LastLaunchSplit();
  }
  g.add_serial = false;
  std::vector<void*> blocks(world);
  for (int b = 0; b < world; ++b) {
    SignalingGemmArgs h = g;
    h.x = static_cast<const char*>(p.base.x) + b * rows * c.k * 2;
    h.m = rows;
    h.out = blocks[b] = static_cast<char*>(prod.p) + b * block * 2;
    MustLaunch(LaunchSignalingGemm(h, s), "plain GEMM");
    split = split || LastLaunchSplit();
  }
  SumRoundedRingOn(blocks, block, exact.p, c.dt, s, /*blocks=*/1);  // block 0: x[0] @ w + x[1] @ w
  CK(cudaMemcpyAsync(sum_ref.p, p.ref.p, block * 4, cudaMemcpyDeviceToDevice, s));
  for (int b = 1; b < world; ++b) AddF32<<<1024, 256, 0, s>>>((const float*)p.ref.p + b * block, (float*)sum_ref.p, block);
  CK(cudaGetLastError());
  for (int i = 0; i < calls; ++i) {
    const char* out = static_cast<const char*>(results.p) + i * out_rows * c.n * 2;  // block 0
    const Verdict v = Compare(out, (const float*)sum_ref.p, rows, c.n, c.dt, s);
    Judge("self", ar, c, i, 0, v, Different(out, exact.p, block, s), !split);
  }
  fflush(stdout);
}

// small: the sanitizer's run, one rank as its own peer only.
void Check(bool small, cudaStream_t s) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int comm_sms = sms / 2;  // each emulated rank's GEMMs on half of the GPU
  std::vector<Case> cases = {{600, 272, 200, {0, 100, 300}, GemmDType::kFloat16}};
  if (!small) {
    cases.push_back({2048, 1024, 512, EvenBands(1024, 4, 256), GemmDType::kBFloat16});
    cases.push_back({4096, 4096, 2048, EvenBands(2048, 6, 256), GemmDType::kBFloat16});
    cases.push_back({8192, 8192, 4096, EvenBands(4096, 8, 256), GemmDType::kBFloat16});
  }
  for (const Case& c : cases) {
    for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
      SelfPeerCase(c, kind, 2, s);
      if (!small) CheckCase(c, kind, 4, comm_sms, s);
    }
  }
}

// Groups of 3, 4 and 8 ranks emulated on one GPU, each rank's GEMMs on SMs / world (the
// others' SMs left free): per world an aligned case and a small odd one (f16, rows per
// block not a tile multiple: 128 x 128 tiles), for 3 and 8 also an odd one large enough for
// 128 x 256 tiles (the all-reduce's bulk-copied mirrors, MirrorStagedRows: partial tile rows
// at band ends, a last column tile narrower than 256), reduce-scatter and all-reduce, 4
// calls each (CheckCase), each result against float32 and bit for bit against the ring's
// rounded running sum.
void CheckGroups(cudaStream_t s) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct GroupCase { int world; Case c; };
  const std::vector<GroupCase> cases = {
      {3, {600, 272, 200, {0, 100, 200}, GemmDType::kFloat16}},
      {3, {3072, 2048, 1024, EvenBands(1024, 2, 256), GemmDType::kBFloat16}},
      {3, {3000, 2000, 512, {0, 400, 1000}, GemmDType::kBFloat16}},
      {4, {600, 272, 200, {0, 50, 150}, GemmDType::kFloat16}},
      {4, {4096, 4096, 2048, EvenBands(1024, 2, 256), GemmDType::kBFloat16}},
      {8, {600, 272, 200, {0, 75}, GemmDType::kFloat16}},
      {8, {8192, 4096, 1024, EvenBands(1024, 2, 256), GemmDType::kBFloat16}},
      {8, {4800, 1000, 256, {0, 200, 600}, GemmDType::kFloat16}},
  };
  for (const GroupCase& gc : cases) {
    for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
      printf("groups: %d ranks on one GPU, %d SMs each\n", gc.world, sms / gc.world);
      CheckCase(gc.c, kind, 4, sms - sms / gc.world, s, /*one_gpu_each=*/false, gc.world);
    }
  }
}

// A group of 4 whose every rank is this one, two all-reduce calls on 128 x 256 tiles: the
// bulk-copied mirrors (MirrorStagedRows: partial tile rows at band ends, a last column tile
// narrower than 256) for compute-sanitizer, which may serialize kernels (separate ranks would
// then wait for each other for ever). Values unchecked: beyond a pair such a rank adds another
// block's sum (SelfPeerCase); `groups` checks the values with separate ranks.
void SanitizeBulkMirrors(cudaStream_t s) {
  setenv("FLASHOVERLAP_GEMM_TILE", "256", 1);
  const int world = 4;
  const int64_t m = 1024, n = 720, k = 256;
  Problem p({m, n, k}, GemmDType::kBFloat16, 4242, s, /*with_ref=*/false);
  EmulatedRank self(0, m / world, n, -1, world);
  for (int i = 1; i < world; ++i) self.PeerWith(self, i);
  Buf result(m * n * 2);
  SignalingGemmArgs seq = p.base;
  seq.layout = BandLayout({0, 100, 256});
  seq.queue = self.queue->p;
  for (int call = 0; call < 2; ++call)
    Must(EnqueuePeerReduce(self.r, s, PeerReduceKind::kAllReduce, seq, result.p), "sequence");
  CK(cudaStreamSynchronize(s));
  unsetenv("FLASHOVERLAP_GEMM_TILE");
  printf("sanitize: a group of 4 that is this rank, 2 all-reduce calls on 128 x 256 tiles: ran\n");
}

// ------------------------------------------------------------------ bench (self as peer)

// Per shape: our GEMM (one group), cuBLAS, our GEMM cut into the groups a sequence with 8
// bands per block launches (2 x 8 bands, rotated: the grouping's own cost), then the
// reduce-scatter and all-reduce sequences with 2 and with 8 bands per block.
void Bench(cudaStream_t s, int* counters, int iters) {
  Cublas cublas;
  cublas.Load();
  constexpr int kCallsPerSample = 5;
  printf("%-18s | %7s %7s %8s | %7s %7s %7s %7s %7s %7s | %s\n", "per-GPU M x N x K", "GEMM", "cuBLAS", "grouped",
         "RS b2", "RS b8", "AR b2", "AR b8", "RS b2s", "AR b2s",
         "over GEMM: grouped, RS b2, RS b8, AR b2, AR b8, RS b2 serial, AR b2 serial");
  uint64_t seed = 40000;
  for (const Shape3& c : kDesignShapes) {
    const GemmDType dt = GemmDType::kBFloat16;
    const int64_t rows = c.m / 2;
    Problem p({c.m, c.n, c.k}, dt, seed += 10, s, /*with_ref=*/false);
    EmulatedRank self(0, rows, c.n);
    self.PeerWith(self, 1);
    Buf result(c.m * c.n * 2);
    SignalingGemmArgs whole = p.Args(EvenLayout(c.m, 1, 1, 256), SelfCommSms());
    whole.counters = counters;
    SignalingGemmArgs grouped = p.Args(EvenLayout(c.m, 1, 16, 256), SelfCommSms());
    grouped.counters = counters;
    grouped.row_rotation = int(rows);
    auto plain = [&](const SignalingGemmArgs& a) {
      return [&, a]() {
        for (int i = 0; i < kCallsPerSample; ++i) {
          CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
          MustLaunch(LaunchSignalingGemm(a, s), "GEMM");
        }
      };
    };
    auto blas = [&]() {
      for (int i = 0; i < kCallsPerSample && cublas.ok(); ++i)
        if (cublas.Run(p.base.x, p.base.w, p.out.p, int(c.m), int(c.n), int(c.k), dt, s) != 0) exit(2);
    };
    auto sequence = [&](PeerReduceKind kind, int bands, bool serial = false) {
      SignalingGemmArgs seq = p.base;
      seq.add_serial = serial;
      seq.comm_sms = SelfCommSms();
      seq.layout = BandLayout(EvenBands(rows, bands, 256));
      seq.queue = self.queue->p;
      return [&, kind, seq]() {
        for (int i = 0; i < kCallsPerSample; ++i) Must(EnqueuePeerReduce(self.r, s, kind, seq, result.p), "sequence");
      };
    };
    const std::vector<float> t = TimeInterleaved(
        {plain(whole), blas, plain(grouped), sequence(PeerReduceKind::kReduceScatter, 2),
         sequence(PeerReduceKind::kReduceScatter, 8), sequence(PeerReduceKind::kAllReduce, 2),
         sequence(PeerReduceKind::kAllReduce, 8), sequence(PeerReduceKind::kReduceScatter, 2, true),
         sequence(PeerReduceKind::kAllReduce, 2, true)},
        s, iters);
    std::vector<double> ms;
    for (float v : t) ms.push_back(v / kCallsPerSample);
    char shape[40];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-18s | %7.3f %7.3f %8.3f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | %.3f %.3f %.3f %.3f %.3f %.3f %.3f\n",
           shape, ms[0], ms[1], ms[2], ms[3], ms[4], ms[5], ms[6], ms[7], ms[8], ms[2] / ms[0], ms[3] / ms[0],
           ms[4] / ms[0], ms[5] / ms[0], ms[6] / ms[0], ms[7] / ms[0], ms[8] / ms[0]);
    char buf[768];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"bench\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"comm_sms\":%d,\"gemm_ms\":%.4f,\"cublas_ms\":%.4f,"
             "\"grouped_gemm_ms\":%.4f,\"reduce_scatter_2_bands_ms\":%.4f,\"reduce_scatter_8_bands_ms\":%.4f,"
             "\"all_reduce_2_bands_ms\":%.4f,\"all_reduce_8_bands_ms\":%.4f,"
             "\"reduce_scatter_2_bands_add_serial_ms\":%.4f,\"all_reduce_2_bands_add_serial_ms\":%.4f}",
             (long long)c.m, (long long)c.n, (long long)c.k, SelfCommSms(), ms[0], ms[1], ms[2], ms[3], ms[4], ms[5],
             ms[6], ms[7], ms[8]);
    AddJson(buf);
    fflush(stdout);
  }
}

// ------------------------------------------------------------------ abort (a peer that never comes)

// Exits the process (its CUDA context is gone after the trap): 0 if the wait gave up as it
// should, 1 if not.
[[noreturn]] void Abort(cudaStream_t s, const std::string& json_path) {
  int* flag = nullptr;
  CK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
  *reinterpret_cast<volatile int*>(flag) = 0;
  int* flag_device = nullptr;
  CK(cudaHostGetDevicePointer(&flag_device, flag, 0));
  const Case c{4096, 4096, 1024, EvenBands(2048, 2, 256), GemmDType::kBFloat16};
  EmulatedRank ranks[2] = {EmulatedRank(0, c.m / 2, c.n), EmulatedRank(1, c.m / 2, c.n)};
  ranks[0].PeerWith(ranks[1]);
  ranks[1].PeerWith(ranks[0]);
  ranks[0].r.abort_flag = flag_device;
  Problem p({c.m, c.n, c.k}, c.dt, 777, s, /*with_ref=*/false);
  Buf result(c.m / 2 * c.n * 2);
  SignalingGemmArgs g = p.base;
  g.layout = BandLayout(c.bands);
  g.queue = ranks[0].queue->p;
  CK(cudaStreamSynchronize(s));
  Must(EnqueuePeerReduce(ranks[0].r, ranks[0].compute, PeerReduceKind::kReduceScatter, g, result.p),
       "EnqueuePeerReduce");
  usleep(1000000);
  const bool waiting = cudaStreamQuery(ranks[0].compute) == cudaErrorNotReady;  // the control
  *reinterpret_cast<volatile int*>(flag) = 1;
  int waited_ms = 0;
  const cudaError_t end = WaitStream(ranks[0].compute, 10000, &waited_ms);
  const bool pass = waiting && end != cudaErrorNotReady && end != cudaSuccess;
  printf("abort: rank 0 alone, still waiting after 1 s: %s; after the abort flag: %s in %d ms  %s\n",
         waiting ? "yes" : "NO", end == cudaErrorNotReady ? "still waiting" : cudaGetErrorName(end), waited_ms,
         pass ? "PASS" : "FAIL");
  if (!json_path.empty()) {
    if (FILE* f = fopen(json_path.c_str(), "w")) {
      fprintf(f, "{\"mode\":\"abort\",\"waiting_after_1s\":%s,\"error\":\"%s\",\"ms_after_flag\":%d,\"pass\":%s}\n",
              waiting ? "true" : "false", cudaGetErrorName(end), waited_ms, pass ? "true" : "false");
      fclose(f);
    }
  }
  fflush(stdout);
  _exit(pass ? 0 : 1);  // no destructors: they would call into the dead context
}

// Per shape: our GEMM alone, then the reduce-scatter and all-reduce sequences (2 bands per
// block) of a group of 2, 4 and 8 whose every rank is this one (every store lands in this
// GPU's memory): what the sequence of a bigger group costs the GEMM on one GPU (the ring's
// add at every block but the first, the all-reduce's several mirrors), NVLink aside. Timing
// only: beyond a pair, the values such a rank adds are another block's (SelfPeerCase); the
// waits are a ring's (queue position d waits for d - 1's counters).
void BenchGroups(cudaStream_t s, int* counters, int iters) {
  const int worlds[] = {2, 4, 8};
  constexpr int kCallsPerSample = 5;
  printf("%-18s | %7s | over GEMM: RS 2, 4, 8 ranks; AR 2, 4, 8 ranks\n", "per-GPU M x N x K", "GEMM");
  uint64_t seed = 45000;
  for (const Shape3& c : kDesignShapes) {
    const GemmDType dt = GemmDType::kBFloat16;
    Problem p({c.m, c.n, c.k}, dt, seed += 10, s, /*with_ref=*/false);
    std::vector<std::unique_ptr<EmulatedRank>> selves;
    for (int world : worlds) {
      selves.push_back(std::make_unique<EmulatedRank>(0, c.m / world, c.n, -1, world));
      for (int i = 1; i < world; ++i) selves.back()->PeerWith(*selves.back(), i);
    }
    Buf result(c.m * c.n * 2);
    SignalingGemmArgs whole = p.Args(EvenLayout(c.m, 1, 1, 256), 0);
    whole.counters = counters;
    std::vector<std::function<void()>> variants = {[&]() {
      for (int i = 0; i < kCallsPerSample; ++i) {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        MustLaunch(LaunchSignalingGemm(whole, s), "GEMM");
      }
    }};
    for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
      for (size_t w = 0; w < selves.size(); ++w) {
        SignalingGemmArgs seq = p.base;
        seq.layout = BandLayout(EvenBands(c.m / worlds[w], 2, 256));
        seq.queue = selves[w]->queue->p;
        EmulatedRank* self = selves[w].get();
        variants.push_back([&, kind, seq, self]() {
          for (int i = 0; i < kCallsPerSample; ++i) Must(EnqueuePeerReduce(self->r, s, kind, seq, result.p), "sequence");
        });
      }
    }
    const std::vector<float> t = TimeInterleaved(variants, s, iters);
    std::vector<double> ms;
    for (float v : t) ms.push_back(v / kCallsPerSample);
    char shape[40];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-18s | %7.3f | %.3f %.3f %.3f  %.3f %.3f %.3f\n", shape, ms[0], ms[1] / ms[0], ms[2] / ms[0],
           ms[3] / ms[0], ms[4] / ms[0], ms[5] / ms[0], ms[6] / ms[0]);
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"bench_groups\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"gemm_ms\":%.4f,"
             "\"reduce_scatter_ms\":{\"2\":%.4f,\"4\":%.4f,\"8\":%.4f},"
             "\"all_reduce_ms\":{\"2\":%.4f,\"4\":%.4f,\"8\":%.4f}}",
             (long long)c.m, (long long)c.n, (long long)c.k, ms[0], ms[1], ms[2], ms[3], ms[4], ms[5], ms[6]);
    AddJson(buf);
    fflush(stdout);
  }
}

// Per shape and group size (2, 4, 8): that many separate ranks on this GPU, each on its own
// stream and SMs / world (comm_sms = SMs - SMs / world), run their sequences at once (the
// ring's real data flow and waits, every rank's stores in its neighbour's own buffers),
// against as many plain GEMMs of the same per-rank shape on the same shares at once: what the
// ring costs each rank's GEMM, NVLink aside. Values as `groups` checks them (here timed only).
void BenchRing(cudaStream_t s, int iters) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int worlds[] = {2, 4, 8};
  constexpr int kCallsPerSample = 3;
  printf("%-18s | %-5s | %8s | over the plain GEMMs: RS, AR (every rank on SMs / world, all at once)\n",
         "per-GPU M x N x K", "ranks", "GEMMs ms");
  uint64_t seed = 47000;
  cudaEvent_t fork;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  for (const Shape3& c : kDesignShapes) {
    Problem p({c.m, c.n, c.k}, GemmDType::kBFloat16, seed += 10, s, /*with_ref=*/false);
    for (int world : worlds) {
      const int comm_sms = sms - sms / world;
      std::vector<std::unique_ptr<EmulatedRank>> ranks;
      std::vector<std::unique_ptr<Buf>> results;
      std::vector<cudaEvent_t> joins(world);
      for (int r = 0; r < world; ++r) {
        ranks.push_back(std::make_unique<EmulatedRank>(r, c.m / world, c.n, -1, world));
        results.push_back(std::make_unique<Buf>(c.m * c.n * 2));
        CK(cudaEventCreateWithFlags(&joins[r], cudaEventDisableTiming));
      }
      for (int r = 0; r < world; ++r)
        for (int i = 0; i < world; ++i)
          if (i != r) ranks[r]->PeerWith(*ranks[i]);
      // Every rank's work on its own stream, forked from and joined back to `s`.
      auto all_ranks = [&](std::function<void(int)> work) {
        CK(cudaEventRecord(fork, s));
        for (int r = 0; r < world; ++r) {
          CK(cudaStreamWaitEvent(ranks[r]->compute, fork, 0));
          for (int i = 0; i < kCallsPerSample; ++i) work(r);
          CK(cudaEventRecord(joins[r], ranks[r]->compute));
        }
        for (int r = 0; r < world; ++r) CK(cudaStreamWaitEvent(s, joins[r], 0));
      };
      SignalingGemmArgs plain = p.base;
      plain.comm_sms = comm_sms;
      plain.layout = EvenLayout(c.m, 1, 1, 256);
      auto gemms = [&, plain]() {
        all_ranks([&](int r) {
          SignalingGemmArgs a = plain;
          a.out = results[r]->p;
          a.queue = ranks[r]->queue->p;
          MustLaunch(LaunchSignalingGemm(a, ranks[r]->compute), "GEMM");
        });
      };
      auto sequences = [&, plain](PeerReduceKind kind) {
        return [&, plain, kind]() {
          all_ranks([&](int r) {
            SignalingGemmArgs a = plain;
            a.out = nullptr;
            a.layout = BandLayout(EvenBands(c.m / world, 2, 256));
            a.queue = ranks[r]->queue->p;
            Must(EnqueuePeerReduce(ranks[r]->r, ranks[r]->compute, kind, a, results[r]->p), "sequence");
          });
        };
      };
      const std::vector<float> t = TimeInterleaved(
          {gemms, sequences(PeerReduceKind::kReduceScatter), sequences(PeerReduceKind::kAllReduce)}, s, iters);
      char shape[40];
      snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
      printf("%-18s | %-5d | %8.3f | %.3f %.3f\n", shape, world, t[0] / kCallsPerSample, t[1] / t[0], t[2] / t[0]);
      char buf[384];
      snprintf(buf, sizeof buf,
               "{\"tag\":\"bench_ring\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"world\":%d,\"comm_sms\":%d,"
               "\"gemms_ms\":%.4f,\"reduce_scatter_ms\":%.4f,\"all_reduce_ms\":%.4f}",
               (long long)c.m, (long long)c.n, (long long)c.k, world, comm_sms, t[0] / kCallsPerSample,
               t[1] / kCallsPerSample, t[2] / kCallsPerSample);
      AddJson(buf);
      fflush(stdout);
      CK(cudaStreamSynchronize(s));
      for (cudaEvent_t e : joins) CK(cudaEventDestroy(e));
    }
  }
  CK(cudaEventDestroy(fork));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  const std::vector<std::string> modes = {"flags", "check", "groups", "bench", "bench_groups", "bench_ring",
                                          "sanitize", "abort", "break", "wait_wrap", "write_methods", "all"};
  if (std::find(modes.begin(), modes.end(), o.mode) == modes.end()) {
    fprintf(stderr, "unknown mode '%s' (flags, check, groups, bench, bench_groups, bench_ring, sanitize, abort, break, "
                    "wait_wrap, write_methods, all)\n",
            o.mode.c_str());
    return 2;
  }
  TestDevice d = StartTestDevice();
  if (o.mode == "abort") Abort(d.stream, o.json_path);
  if (o.mode == "wait_wrap" || o.mode == "all") WaitWrap();
  if (o.mode == "write_methods" || o.mode == "all") WriteMethods();
  if (o.mode == "flags" || o.mode == "all") Flags(d.counters, d.stream, 20);
  if (o.mode == "sanitize") Flags(d.counters, d.stream, 2000);
  if (o.mode == "check" || o.mode == "all") Check(/*small=*/false, d.stream);
  if (o.mode == "sanitize") Check(/*small=*/true, d.stream);
  if (o.mode == "sanitize") SanitizeBulkMirrors(d.stream);
  if (o.mode == "groups" || o.mode == "all") CheckGroups(d.stream);
  if (o.mode == "bench" || o.mode == "all") Bench(d.stream, d.counters, o.iters);
  if (o.mode == "bench_groups" || o.mode == "all") BenchGroups(d.stream, d.counters, o.iters);
  if (o.mode == "bench_ring" || o.mode == "all") BenchRing(d.stream, o.iters);
  if (o.mode == "break" || o.mode == "all") BreakCheck(/*two_gpus=*/false, d.stream);
  char fields[64];
  snprintf(fields, sizeof fields, ",\"iters\":%d", o.iters);
  return FinishTest(d, o.mode, o.json_path, fields);
}
