// Standalone test + benchmark of the peer-store reduction: the signaling GEMM's reduction in
// the epilogue and its mirror stores (SignalingGemmArgs::add_from, mirror_slot) and the
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
//   peer_reduce_test bench    : one rank on the whole GPU (comm_sms 0) with itself as its peer
//                               (its peer stores land in its own memory: everything a real
//                               pair does but NVLink's bandwidth and latency): our GEMM,
//                               cuBLAS, our GEMM in the sequence's 16 rotated groups, then the
//                               reduce-scatter and all-reduce sequences with 2 and 8 bands
//                               per block, and with 2 bands and add_serial (the add ring's
//                               A/B) (CUDA events, interleaved, median of --iters samples of
//                               5 calls)
//   peer_reduce_test sanitize : flags + the small case with the rank as its own peer (no two
//                               kernels need to run at once: compute-sanitizer may serialize)
//   peer_reduce_test abort    : a peer that never comes: rank 0 calls, rank 1 never does; its
//                               GEMM must still be waiting after 1 s (the control), then, once
//                               the host sets the abort flag (host-mapped, as the watchdog's),
//                               fail (trap) within 10 s instead of waiting for ever. Leaves the
//                               CUDA context unusable: run alone, last
// Options: --json PATH, --iters N (bench, default 15). Exit code 1 if a check failed.
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "gemm_test_common.cuh"
#include "../../xla_ffi/comm/peer_reduce.h"
#include "../../xla_ffi/comm/stream_write.h"

namespace {

void Must(const Status& s, const char* what) {
  if (!s.ok()) { fprintf(stderr, "%s: %s\n", what, s.message.c_str()); exit(2); }
}
void MustLaunch(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorString(e), LastSignalingGemmError()); exit(2); }
}

// PEER_REDUCE_COMM_SMS: SMs the self-peer runs leave free (default 0: the whole GPU).
int SelfCommSms() {
  const char* v = getenv("PEER_REDUCE_COMM_SMS");
  return v == nullptr ? 0 : atoi(v);
}

// a + b elementwise in fp32, rounded once (NCCL's sum of two rounded partials).
template <class T>
__global__ void AddRounded(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = FromF<T>(ToF(a[i]) + ToF(b[i]));
}
// ref += a (fp32 references of sums: the partial added to x @ w, or a second rank's product).
__global__ void AddF32(const float* a, float* ref, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ref[i] += a[i];
}
template <class T>
__global__ void AddToRef(const T* a, float* ref, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ref[i] += ToF(a[i]);
}
__global__ void CountDifferent(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* diff) {
  unsigned long long d = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d += a[i] != b[i];
  for (int off = 16; off > 0; off /= 2) d += __shfl_down_sync(0xffffffffu, d, off);
  if (threadIdx.x % 32 == 0 && d) atomicAdd(diff, d);
}

unsigned long long Different(const void* a, const void* b, int64_t n, cudaStream_t s) {
  Buf d(8);
  CK(cudaMemsetAsync(d.p, 0, 8, s));
  CountDifferent<<<1024, 256, 0, s>>>((const uint16_t*)a, (const uint16_t*)b, n, (unsigned long long*)d.p);
  CK(cudaGetLastError());
  unsigned long long h = 0;
  CK(cudaMemcpyAsync(&h, d.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return h;
}

// Error of `out` [rows, N] against the fp32 reference rows [rows, N] (identity layout).
struct Verdict { double rel_err; unsigned long long bad, wrong; };
Verdict Compare(const void* out, const float* ref, int64_t rows, int64_t n, GemmDType dt, cudaStream_t s) {
  std::vector<int> ident(rows);
  for (int64_t r = 0; r < rows; ++r) ident[r] = int(r);
  Buf d_dst(rows * 4), acc(16), bad(8), wrong(8);
  CK(cudaMemcpyAsync(d_dst.p, ident.data(), rows * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(acc.p, 0, 16, s));
  CK(cudaMemsetAsync(bad.p, 0, 8, s));
  CK(cudaMemsetAsync(wrong.p, 0, 8, s));
  if (dt == GemmDType::kBFloat16)
    ErrorStats<<<1024, 256, 0, s>>>((const __nv_bfloat16*)out, ref, (int*)d_dst.p, rows, n, (double*)acc.p, (unsigned long long*)bad.p);
  else
    ErrorStats<<<1024, 256, 0, s>>>((const __half*)out, ref, (int*)d_dst.p, rows, n, (double*)acc.p, (unsigned long long*)bad.p);
  double h[2];
  CK(cudaMemcpyAsync(h, acc.p, 16, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  const float rms = float(std::sqrt(h[1] / double(rows * n)));
  if (dt == GemmDType::kBFloat16)
    CountWrong<<<1024, 256, 0, s>>>((const __nv_bfloat16*)out, ref, (int*)d_dst.p, rows, n, 0.02f, 0.02f * rms, (unsigned long long*)wrong.p);
  else
    CountWrong<<<1024, 256, 0, s>>>((const __half*)out, ref, (int*)d_dst.p, rows, n, 0.02f, 0.02f * rms, (unsigned long long*)wrong.p);
  CK(cudaGetLastError());
  Verdict v{std::sqrt(h[0] / std::max(h[1], 1e-30)), 0, 0};
  CK(cudaMemcpyAsync(&v.bad, bad.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&v.wrong, wrong.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return v;
}

void AddRoundedOn(const void* a, const void* b, void* out, int64_t n, GemmDType dt, cudaStream_t s) {
  if (dt == GemmDType::kBFloat16) AddRounded<<<1024, 256, 0, s>>>((const __nv_bfloat16*)a, (const __nv_bfloat16*)b, (__nv_bfloat16*)out, n);
  else AddRounded<<<1024, 256, 0, s>>>((const __half*)a, (const __half*)b, (__half*)out, n);
  CK(cudaGetLastError());
}

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
    Must(EnqueueWriteFlag(side, (int32_t*)arrived.p + g, int32_t(TilesInGroup(a, g))), "counter write");
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

// ------------------------------------------------------------------ two ranks, one GPU

struct Case {
  int64_t m, n, k;  // per rank: x [M, K], w [K, N]
  std::vector<int> bands;
  GemmDType dt;
};

// A result's verdict: no poison left, within bf16 rounding of float32, and (compare_bits)
// bit-equal to the NCCL-style rounded sum; printed, counted, and added to the JSON report.
// The bits are comparable only where the sequence's launch and the reference GEMMs accumulate
// every element in the same order: not where either had a split tail (its last units' K
// loops cut into chunks summed in fp32; whether a launch has one depends on the GPU's
// cluster occupancy). FLASHOVERLAP_GEMM_TAIL=whole compares every case.
void Judge(const char* tag, bool ar, const Case& c, int call, int rank, const Verdict& v, unsigned long long diff,
           bool compare_bits) {
  const bool pass = v.bad == 0 && v.wrong == 0 && v.rel_err < 1e-2 && (diff == 0 || !compare_bits);
  g_failures += !pass;
  printf("%s %s %5lldx%5lldx%5lld %s bands %2zu call %d rank %d: rel %.2e, NaN %llu, off %llu, "
         "bits != NCCL-style sum %llu%s  %s\n",
         tag, ar ? "AR" : "RS", (long long)c.m, (long long)c.n, (long long)c.k, DtName(c.dt), c.bands.size() - 1, call,
         rank, v.rel_err, v.bad, v.wrong, diff, compare_bits ? "" : " (split tail: not compared)",
         pass ? "PASS" : "FAIL");
  char buf[440];
  snprintf(buf, sizeof buf,
           "{\"tag\":\"%s\",\"op\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"dtype\":\"%s\",\"groups\":%zu,"
           "\"call\":%d,\"rank\":%d,\"rel_err\":%.3e,\"bad\":%llu,\"wrong\":%llu,\"bits_different\":%llu,"
           "\"bits_compared\":%s,\"pass\":%s}",
           tag, ar ? "AR" : "RS", (long long)c.m, (long long)c.n, (long long)c.k, DtName(c.dt), c.bands.size() - 1,
           call, rank, v.rel_err, v.bad, v.wrong, diff, compare_bits ? "true" : "false", pass ? "true" : "false");
  AddJson(buf);
}

// Whether the last signaling-GEMM launch cut its last units' K loops (Judge).
bool LastLaunchSplit() { return LastSignalingGemmLaunch().split_units > 0; }

// One emulated rank: its stream, buffers and the sequence's state.
struct EmulatedRank {
  PeerReduceRank r;
  cudaStream_t compute;
  std::unique_ptr<Buf> recv, signals, queue;
  EmulatedRank(int rank, int64_t rows, int64_t n) {
    r.buffers.rank = rank;
    CK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    r.wait_method = ChosenWaitMethod(0);
    const size_t bytes = size_t(rows) * n * 2;
    recv = std::make_unique<Buf>(bytes);
    signals = std::make_unique<Buf>(sizeof(int32_t) * kPeerSignalWords);
    queue = std::make_unique<Buf>(kGemmQueueBytes);
    CK(cudaMemset(recv->p, 0xFF, bytes));  // NaN: a partial read before it arrived shows
    CK(cudaMemset(signals->p, 0, sizeof(int32_t) * kPeerSignalWords));
    r.buffers.recv = recv->p;
    r.buffers.signals = (int32_t*)signals->p;
  }
  void PeerWith(EmulatedRank& peer) {
    r.buffers.peer_recv = peer.recv->p;
    r.buffers.peer_signals = peer.r.buffers.signals;
  }
  ~EmulatedRank() { cudaStreamDestroy(compute); }
};

GroupLayout BandLayout(const std::vector<int>& bands) { return MakeLayout(0, 1, bands); }

// Calls of both ranks back to back (rank 0's call c, rank 1's call c, ...), fresh inputs per
// call, then every call's result checked.
void CheckCase(const Case& c, PeerReduceKind kind, int calls, int comm_sms, cudaStream_t s) {
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int64_t rows = c.m / 2, out_rows = ar ? c.m : rows;
  const int64_t x_elems = c.m * c.k, w_elems = c.k * c.n, out_elems = out_rows * c.n;
  EmulatedRank ranks[2] = {EmulatedRank(0, rows, c.n), EmulatedRank(1, rows, c.n)};
  ranks[0].PeerWith(ranks[1]);
  ranks[1].PeerWith(ranks[0]);
  std::vector<std::unique_ptr<Buf>> x[2], result[2];
  Buf w0(w_elems * 2), w1(w_elems * 2);
  const void* w[2] = {w0.p, w1.p};
  static uint64_t seed = 30000;
  Fill(w0.p, w_elems, c.dt, seed += 7, s);
  Fill(w1.p, w_elems, c.dt, seed += 7, s);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < calls; ++i) {
      x[r].push_back(std::make_unique<Buf>(x_elems * 2));
      result[r].push_back(std::make_unique<Buf>(out_elems * 2));
      Fill(x[r][i]->p, x_elems, c.dt, seed += 7, s);
      CK(cudaMemsetAsync(result[r][i]->p, 0xFF, out_elems * 2, s));
    }
  }
  CK(cudaStreamSynchronize(s));
  SignalingGemmArgs base;
  base.n = c.n;
  base.k = c.k;
  base.m = c.m;
  base.dtype = c.dt;
  base.comm_sms = comm_sms;
  base.layout = BandLayout(c.bands);
  bool split = false;  // a launch of the sequence or of the references had a split tail
  for (int i = 0; i < calls; ++i) {
    for (int r = 0; r < 2; ++r) {
      SignalingGemmArgs g = base;
      g.x = x[r][i]->p;
      g.w = w[r];
      g.queue = ranks[r].queue->p;
      g.add_serial = i % 2 == 1;
      Must(EnqueuePeerReduce(ranks[r].r, ranks[r].compute, kind, g, result[r][i]->p), "EnqueuePeerReduce");
      split = split || LastLaunchSplit();
    }
  }
  CK(cudaStreamSynchronize(ranks[0].compute));
  CK(cudaStreamSynchronize(ranks[1].compute));

  // References per call: fp32 x0 @ w0 + x1 @ w1, and the rounded sum of the two ranks'
  // rounded products from plain GEMMs per block (same bands); bit-equal where neither has a
  // split tail (Judge).
  Buf ref(c.m * c.n * 4), ref1(c.m * c.n * 4), p0(c.m * c.n * 2), p1(c.m * c.n * 2), exact(c.m * c.n * 2);
  for (int i = 0; i < calls; ++i) {
    Reference(x[0][i]->p, w0.p, (float*)ref.p, int(c.m), int(c.n), int(c.k), c.dt, s);
    Reference(x[1][i]->p, w1.p, (float*)ref1.p, int(c.m), int(c.n), int(c.k), c.dt, s);
    AddF32<<<1024, 256, 0, s>>>((const float*)ref1.p, (float*)ref.p, c.m * c.n);
    CK(cudaGetLastError());
    void* prod[2] = {p0.p, p1.p};
    for (int r = 0; r < 2; ++r) {
      for (int b = 0; b < 2; ++b) {
        SignalingGemmArgs g = base;
        g.x = static_cast<const char*>(x[r][i]->p) + b * rows * c.k * 2;
        g.w = w[r];
        g.m = rows;
        g.out = static_cast<char*>(prod[r]) + b * rows * c.n * 2;
        g.queue = ranks[0].queue->p;
        MustLaunch(LaunchSignalingGemm(g, s), "plain GEMM");
        split = split || LastLaunchSplit();
      }
    }
    AddRoundedOn(p0.p, p1.p, exact.p, c.m * c.n, c.dt, s);
    for (int r = 0; r < 2; ++r) {
      const int64_t first = ar ? 0 : r * rows;
      const Verdict v = Compare(result[r][i]->p, (const float*)ref.p + first * c.n, out_rows, c.n, c.dt, s);
      const unsigned long long diff =
          Different(result[r][i]->p, static_cast<const char*>(exact.p) + first * c.n * 2, out_elems, s);
      Judge("check", ar, c, i, r, v, diff, !split);
    }
  }
  fflush(stdout);
}

// One rank whose peer is itself (its peer stores land in its own memory): the whole sequence
// with no second rank, so no two kernels need to run at once (compute-sanitizer). Phase 2 adds
// phase 1's product: the result's block 0 is x[block 0] @ w + x[block 1] @ w (an all-reduce's
// mirror stores land on those same rows; its block 1 is the peer's to write: none here).
void SelfPeerCase(const Case& c, PeerReduceKind kind, int calls, cudaStream_t s) {
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int64_t rows = c.m / 2, out_rows = ar ? c.m : rows, block = rows * c.n;
  EmulatedRank self(0, rows, c.n);
  self.PeerWith(self);
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
  for (int b = 0; b < 2; ++b) {
    SignalingGemmArgs h = g;
    h.x = static_cast<const char*>(p.base.x) + b * rows * c.k * 2;
    h.m = rows;
    h.out = static_cast<char*>(prod.p) + b * block * 2;
    MustLaunch(LaunchSignalingGemm(h, s), "plain GEMM");
    split = split || LastLaunchSplit();
  }
  AddRoundedOn(prod.p, static_cast<char*>(prod.p) + block * 2, exact.p, block, c.dt, s);
  CK(cudaMemcpyAsync(sum_ref.p, p.ref.p, block * 4, cudaMemcpyDeviceToDevice, s));
  AddF32<<<1024, 256, 0, s>>>((const float*)p.ref.p + block, (float*)sum_ref.p, block);
  CK(cudaGetLastError());
  for (int i = 0; i < calls; ++i) {
    const char* out = static_cast<const char*>(results.p) + i * out_rows * c.n * 2;  // block 0
    const Verdict v = Compare(out, (const float*)sum_ref.p, rows, c.n, c.dt, s);
    Judge("self", ar, c, i, 0, v, Different(out, exact.p, block, s), !split);
  }
  fflush(stdout);
}

std::vector<int> EvenBands(int64_t rows, int groups, int align) {
  const GroupLayout L = EvenLayout(rows, 1, groups, align);
  return std::vector<int>(L.band_rows, L.band_rows + L.num_groups + 1);
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

// ------------------------------------------------------------------ bench (self as peer)

// Per shape: our GEMM (one group), cuBLAS, our GEMM cut into the groups a sequence with 8
// bands per block launches (2 x 8 bands, rotated: the grouping's own cost), then the
// reduce-scatter and all-reduce sequences with 2 and with 8 bands per block.
void Bench(cudaStream_t s, int* counters, int iters) {
  Cublas cublas;
  cublas.Load();
  struct B { int64_t m, n, k; };
  const std::vector<B> cases = {{4096, 8192, 4096}, {8192, 8192, 4096}, {16384, 8192, 8192},
                                {8192, 28672, 4096}, {8192, 8192, 14336}};
  constexpr int kCallsPerSample = 5;
  printf("%-18s | %7s %7s %8s | %7s %7s %7s %7s %7s %7s | %s\n", "per-GPU M x N x K", "GEMM", "cuBLAS", "grouped",
         "RS b2", "RS b8", "AR b2", "AR b8", "RS b2s", "AR b2s",
         "over GEMM: grouped, RS b2, RS b8, AR b2, AR b8, RS b2 serial, AR b2 serial");
  uint64_t seed = 40000;
  for (const B& c : cases) {
    const GemmDType dt = GemmDType::kBFloat16;
    const int64_t rows = c.m / 2;
    Problem p({c.m, c.n, c.k}, dt, seed += 10, s, /*with_ref=*/false);
    EmulatedRank self(0, rows, c.n);
    self.PeerWith(self);
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
  cudaError_t end = cudaErrorNotReady;
  int waited_ms = 0;
  for (; waited_ms < 10000 && end == cudaErrorNotReady; waited_ms += 10) {
    usleep(10000);
    end = cudaStreamQuery(ranks[0].compute);
  }
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

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  std::string json_path;
  int iters = 15;
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if (iters < 1) { fprintf(stderr, "bad --iters\n"); return 2; }
  TestDevice d = StartTestDevice();
  if (mode == "abort") Abort(d.stream, json_path);
  if (mode == "flags" || mode == "all") Flags(d.counters, d.stream, 20);
  if (mode == "sanitize") Flags(d.counters, d.stream, 2000);
  if (mode == "check" || mode == "all") Check(/*small=*/false, d.stream);
  if (mode == "sanitize") Check(/*small=*/true, d.stream);
  if (mode == "bench" || mode == "all") Bench(d.stream, d.counters, iters);
  char fields[64];
  snprintf(fields, sizeof fields, ",\"iters\":%d", iters);
  return FinishTest(d, mode, json_path, fields);
}
