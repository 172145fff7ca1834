// What peer_reduce_test (two ranks emulated on one GPU) and peer_reduce_2gpu_test (rank r on
// GPU r) share: the reference arithmetic (the NCCL-style rounded sum, bit comparison, error
// against float32), the verdict, a rank's buffers, and the two-rank check of one case.
// Included by one .cu each (test programs: one translation unit apiece).
#pragma once

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

// Error of `out` [rows, N] against the fp32 reference rows [rows, N] (identity layout). An
// element is wrong past 2% of itself plus 2% of the reference's RMS times the square root of
// `roundings`: the bf16 / f16 roundings between the fp32 products and `out`, beyond the
// products' own (a ring of n ranks rounds each running sum, n - 1 times; their errors add
// up like a random walk, and a running sum can be larger than the final value).
struct Verdict { double rel_err; unsigned long long bad, wrong; };
Verdict Compare(const void* out, const float* ref, int64_t rows, int64_t n, GemmDType dt, cudaStream_t s,
                int roundings = 1) {
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
  const float tol_abs = 0.02f * rms * std::sqrt(float(std::max(roundings, 1)));
  if (dt == GemmDType::kBFloat16)
    CountWrong<<<1024, 256, 0, s>>>((const __nv_bfloat16*)out, ref, (int*)d_dst.p, rows, n, 0.02f, tol_abs, (unsigned long long*)wrong.p);
  else
    CountWrong<<<1024, 256, 0, s>>>((const __half*)out, ref, (int*)d_dst.p, rows, n, 0.02f, tol_abs, (unsigned long long*)wrong.p);
  CK(cudaGetLastError());
  Verdict v{std::sqrt(h[0] / std::max(h[1], 1e-30)), 0, 0};
  CK(cudaMemcpyAsync(&v.bad, bad.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&v.wrong, wrong.p, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return v;
}

// Block b of `out` (block_elems elements each) = the ring's running sum (docs/DESIGN.md, "Ring
// reduction"): rank b - 1's rounded product, to which ranks b - 2, b - 3, ..., b + 1 and b
// each add theirs in fp32 and round (each rank's epilogue: its own product plus what the next
// rank passed it). For 2 ranks, NCCL's sum of the two rounded partials. Only the first
// `blocks` blocks (every p[j] holds at least that many).
template <class T>
__global__ void SumRoundedRing(const T* const* p, int world, int64_t block_elems, int blocks, T* out) {
  const int64_t n = blocks * block_elems;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int b = int(i / block_elems);
    T acc = p[(b + world - 1) % world][i];
    for (int j = world - 2; j >= 0; --j) acc = FromF<T>(ToF(p[(b + j) % world][i]) + ToF(acc));
    out[i] = acc;
  }
}
void SumRoundedRingOn(const std::vector<void*>& products, int64_t block_elems, void* out, GemmDType dt,
                         cudaStream_t s, int blocks = -1) {
  Buf table(products.size() * sizeof(void*));
  CK(cudaMemcpyAsync(table.p, products.data(), products.size() * sizeof(void*), cudaMemcpyHostToDevice, s));
  const int world = int(products.size());
  if (blocks < 0) blocks = world;
  if (dt == GemmDType::kBFloat16)
    SumRoundedRing<<<1024, 256, 0, s>>>((const __nv_bfloat16* const*)table.p, world, block_elems, blocks,
                                        (__nv_bfloat16*)out);
  else
    SumRoundedRing<<<1024, 256, 0, s>>>((const __half* const*)table.p, world, block_elems, blocks, (__half*)out);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));  // before `table` goes
}

void AddRoundedOn(const void* a, const void* b, void* out, int64_t n, GemmDType dt, cudaStream_t s) {
  if (dt == GemmDType::kBFloat16) AddRounded<<<1024, 256, 0, s>>>((const __nv_bfloat16*)a, (const __nv_bfloat16*)b, (__nv_bfloat16*)out, n);
  else AddRounded<<<1024, 256, 0, s>>>((const __half*)a, (const __half*)b, (__half*)out, n);
  CK(cudaGetLastError());
}

// ------------------------------------------------------------------ ranks emulated on one GPU

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

// --first-call N: every emulated rank starts as if N calls had run (its call count and the
// call-number words the others wait on), so a few calls cross a wrap (2147483645: the third
// call's number is INT32_MIN; peer_reduce.h's numbers wrap past 2^31).
inline uint32_t g_first_call = 0;

// One rank: its stream, buffers and the sequence's state, on `device` (-1: the current one;
// peer_reduce_test emulates both ranks on one GPU, peer_reduce_2gpu_test puts rank r on GPU r).
// Leaves `device` current.
struct EmulatedRank {
  PeerReduceRank r;
  int device = 0;
  cudaStream_t compute;
  std::unique_ptr<Buf> recv, signals, queue;
  // world: the group's size (its recv holds PeerRecvBlocks(world) blocks of rows x n, and
  // extra_blocks more: a staged all-reduce's staging area).
  EmulatedRank(int rank, int64_t rows, int64_t n, int on_device = -1, int world = 2, int extra_blocks = 0) {
    if (on_device >= 0) CK(cudaSetDevice(on_device));
    CK(cudaGetDevice(&device));
    r.buffers.rank = rank;
    r.buffers.world = world;
    CK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    r.wait_method = ChosenWaitMethod(device);
    r.write_method = ChosenWriteMethod();
    // As a communicator does (communicator.cc): with spin waits, the wait and write kernels'
    // lazy loads at their first launch would wait for the GEMM already running, which waits
    // for the other emulated rank's launch that this thread has not made yet: a deadlock.
    CK(LoadSpinWaitKernel());
    CK(LoadWriteFlagKernel());
    const size_t bytes = size_t(PeerRecvBlocks(world) + extra_blocks) * rows * n * 2;
    recv = std::make_unique<Buf>(bytes);
    signals = std::make_unique<Buf>(sizeof(int32_t) * kPeerSignalWords);
    queue = std::make_unique<Buf>(kGemmQueueBytes);
    CK(cudaMemset(recv->p, 0xFF, bytes));  // NaN: a partial read before it arrived shows
    CK(cudaMemset(signals->p, 0, sizeof(int32_t) * kPeerSignalWords));
    if (g_first_call != 0) {  // the others' credit and done words, as after that many calls
      r.calls = g_first_call;
      std::vector<int32_t> words(2 * kMaxPeerRanks, static_cast<int32_t>(g_first_call));
      static_assert(kPeerDone == kPeerCredit + kMaxPeerRanks, "credit and done words adjoin");
      CK(cudaMemcpy(static_cast<int32_t*>(signals->p) + kPeerCredit, words.data(),
                    words.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    r.buffers.recv = recv->p;
    r.buffers.signals = (int32_t*)signals->p;
  }
  // Rank `other` of the group is `peer` (a rank of 2 that is its own peer: PeerWith(*this, 1)).
  void PeerWith(EmulatedRank& peer, int other = -1) {
    if (other < 0) other = peer.r.buffers.rank;
    r.buffers.peers_recv[other] = peer.recv->p;
    r.buffers.peers_signals[other] = peer.r.buffers.signals;
  }
  ~EmulatedRank() { cudaStreamDestroy(compute); }
};

GroupLayout BandLayout(const std::vector<int>& bands) { return MakeLayout(0, 1, bands); }

// Calls of every rank back to back (rank 0's call c, rank 1's call c, ...), `world` ranks,
// fresh inputs per call, then every call's result checked on device 0 (`s` is device 0's
// stream). one_gpu_each: rank r on device r (peer access enabled by the caller), its inputs
// copied there and its results copied back for the checks; else every rank on device 0.
void CheckCase(const Case& c, PeerReduceKind kind, int calls, int comm_sms, cudaStream_t s,
               bool one_gpu_each = false, int world = 2) {
  const bool ar = kind == PeerReduceKind::kAllReduce;
  const int64_t rows = c.m / world, out_rows = ar ? c.m : rows;
  const int64_t x_elems = c.m * c.k, w_elems = c.k * c.n, out_elems = out_rows * c.n;
  auto device_of = [&](int r) { return one_gpu_each ? r : 0; };
  std::vector<std::unique_ptr<EmulatedRank>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(std::make_unique<EmulatedRank>(r, rows, c.n, device_of(r), world));
  CK(cudaSetDevice(0));
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < world; ++i)
      if (i != r) ranks[r]->PeerWith(*ranks[i]);
  // Operands and results on device 0 (the checks'), then, one_gpu_each, copies where rank r runs.
  std::vector<std::vector<std::unique_ptr<Buf>>> x(world), result(world), x_there(world), result_there(world);
  std::vector<std::unique_ptr<Buf>> w(world), w_there(world);
  static uint64_t seed = 30000;
  for (int r = 0; r < world; ++r) {
    w[r] = std::make_unique<Buf>(w_elems * 2);
    Fill(w[r]->p, w_elems, c.dt, seed += 7, s);
    for (int i = 0; i < calls; ++i) {
      x[r].push_back(std::make_unique<Buf>(x_elems * 2));
      result[r].push_back(std::make_unique<Buf>(out_elems * 2));
      Fill(x[r][i]->p, x_elems, c.dt, seed += 7, s);
      CK(cudaMemsetAsync(result[r][i]->p, 0xFF, out_elems * 2, s));
    }
  }
  CK(cudaStreamSynchronize(s));
  for (int r = 1; r < world && one_gpu_each; ++r) {
    CK(cudaSetDevice(r));
    w_there[r] = std::make_unique<Buf>(w_elems * 2);
    CK(cudaMemcpyPeer(w_there[r]->p, r, w[r]->p, 0, w_elems * 2));
    for (int i = 0; i < calls; ++i) {
      x_there[r].push_back(std::make_unique<Buf>(x_elems * 2));
      result_there[r].push_back(std::make_unique<Buf>(out_elems * 2));
      CK(cudaMemcpyPeer(x_there[r][i]->p, r, x[r][i]->p, 0, x_elems * 2));
      CK(cudaMemset(result_there[r][i]->p, 0xFF, out_elems * 2));
    }
    CK(cudaDeviceSynchronize());
  }
  CK(cudaSetDevice(0));
  const bool there = one_gpu_each;
  auto x_of = [&](int r, int i) { return r > 0 && there ? x_there[r][i]->p : x[r][i]->p; };
  auto w_of = [&](int r) { return static_cast<const void*>(r > 0 && there ? w_there[r]->p : w[r]->p); };
  auto result_of = [&](int r, int i) { return r > 0 && there ? result_there[r][i]->p : result[r][i]->p; };
  SignalingGemmArgs base;
  base.n = c.n;
  base.k = c.k;
  base.m = c.m;
  base.dtype = c.dt;
  base.comm_sms = comm_sms;
  base.layout = BandLayout(c.bands);
  bool split = false;  // a launch of the sequence or of the references had a split tail
  for (int i = 0; i < calls; ++i) {
    for (int r = 0; r < world; ++r) {
      CK(cudaSetDevice(ranks[r]->device));  // the launcher plans for the current device
      SignalingGemmArgs g = base;
      g.x = x_of(r, i);
      g.w = w_of(r);
      g.queue = ranks[r]->queue->p;
      g.add_serial = i % 2 == 1;
      Must(EnqueuePeerReduce(ranks[r]->r, ranks[r]->compute, kind, g, result_of(r, i)), "EnqueuePeerReduce");
      split = split || LastLaunchSplit();
    }
  }
  for (int r = 0; r < world; ++r) {
    CK(cudaSetDevice(ranks[r]->device));
    CK(cudaStreamSynchronize(ranks[r]->compute));
  }
  CK(cudaSetDevice(0));
  for (int r = 1; r < world && there; ++r)
    for (int i = 0; i < calls; ++i) CK(cudaMemcpyPeer(result[r][i]->p, 0, result_there[r][i]->p, r, out_elems * 2));

  // References per call: fp32 sum of every rank's x @ w, and the ring's rounded running sum of
  // the ranks' rounded products from plain GEMMs per block (same bands; SumRoundedRing);
  // bit-equal where none has a split tail (Judge).
  Buf ref(c.m * c.n * 4), ref_r(c.m * c.n * 4), exact(c.m * c.n * 2);
  std::vector<std::unique_ptr<Buf>> prod(world);
  std::vector<void*> prods(world);
  for (int r = 0; r < world; ++r) prods[r] = (prod[r] = std::make_unique<Buf>(c.m * c.n * 2))->p;
  for (int i = 0; i < calls; ++i) {
    for (int r = 0; r < world; ++r) {
      Reference(x[r][i]->p, w[r]->p, (float*)(r == 0 ? ref.p : ref_r.p), int(c.m), int(c.n), int(c.k), c.dt, s);
      if (r > 0) AddF32<<<1024, 256, 0, s>>>((const float*)ref_r.p, (float*)ref.p, c.m * c.n);
      CK(cudaGetLastError());
      for (int b = 0; b < world; ++b) {
        SignalingGemmArgs g = base;
        g.x = static_cast<const char*>(x[r][i]->p) + b * rows * c.k * 2;
        g.w = w[r]->p;
        g.m = rows;
        g.out = static_cast<char*>(prods[r]) + b * rows * c.n * 2;
        g.queue = ranks[0]->queue->p;
        MustLaunch(LaunchSignalingGemm(g, s), "plain GEMM");
        split = split || LastLaunchSplit();
      }
    }
    SumRoundedRingOn(prods, rows * c.n, exact.p, c.dt, s);
    for (int r = 0; r < world; ++r) {
      const int64_t first = ar ? 0 : r * rows;
      const Verdict v = Compare(result[r][i]->p, (const float*)ref.p + first * c.n, out_rows, c.n, c.dt, s, world - 1);
      const unsigned long long diff =
          Different(result[r][i]->p, static_cast<const char*>(exact.p) + first * c.n * 2, out_elems, s);
      const std::string tag = world == 2 ? "check" : "check" + std::to_string(world);
      Judge(tag.c_str(), ar, c, i, r, v, diff, !split);
    }
  }
  fflush(stdout);
}

// A program's arguments: MODE [--json PATH] [--iters N] [--world N] [--first-call N] (default
// mode "all", 15 iterations, world 2: peer_reduce_2gpu_test's group size, first call 0);
// exits 2 on anything else.
struct Options {
  std::string mode = "all", json_path;
  int iters = 15;
  int world = 2;
};
Options ParseOptions(int argc, char** argv) {
  Options o;
  if (argc > 1) o.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) o.json_path = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) o.iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--world") && i + 1 < argc) o.world = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--first-call") && i + 1 < argc) g_first_call = strtoul(argv[++i], nullptr, 10);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); exit(2); }
  }
  if (o.iters < 1) { fprintf(stderr, "bad --iters\n"); exit(2); }
  if (o.world < 2 || o.world > kMaxPeerRanks) { fprintf(stderr, "--world must be in [2, %d]\n", kMaxPeerRanks); exit(2); }
  return o;
}

std::vector<int> EvenBands(int64_t rows, int groups, int align) {
  const GroupLayout L = EvenLayout(rows, 1, groups, align);
  return std::vector<int>(L.band_rows, L.band_rows + L.num_groups + 1);
}

// Polls `stream` until it is done or `limit_ms` passed; returns its last status and the time.
cudaError_t WaitStream(cudaStream_t stream, int limit_ms, int* waited_ms) {
  cudaError_t end = cudaStreamQuery(stream);
  for (*waited_ms = 0; *waited_ms < limit_ms && end == cudaErrorNotReady; *waited_ms += 5) {
    usleep(5000);
    end = cudaStreamQuery(stream);
  }
  return end;
}

// A plain GEMM on the current device, checked against float32: the GPU is still usable.
bool PlainGemmRight(uint64_t seed, Verdict* v) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    Problem q({1024, 768, 512}, GemmDType::kBFloat16, seed, s);
    CK(cudaMemsetAsync(q.base.out, 0xFF, 1024 * 768 * 2, s));
    Buf queue(kGemmQueueBytes);  // on this device (GemmQueue() is GPU 0's)
    SignalingGemmArgs a = q.Args(EvenLayout(1024, 1, 4, 256), 0);
    a.queue = queue.p;
    MustLaunch(LaunchSignalingGemm(a, s), "plain GEMM");
    *v = Compare(a.out, (const float*)q.ref.p, 1024, 768, GemmDType::kBFloat16, s);
    CK(cudaStreamSynchronize(s));
  }
  CK(cudaStreamDestroy(s));
  return v->bad == 0 && v->wrong == 0 && v->rel_err < 1e-2;
}

// A rank whose call failed (peer_reduce.h, EnqueueBreakPeers: what the handler does on a
// failure). Call 1 by both ranks; then rank 0 enqueues calls 2 and 3 (its host ahead), which
// must still wait after 1 s (the control: its peer's stores never come), and rank 1 breaks the
// pair instead of calling: both of rank 0's calls must then end within 10 s with no CUDA
// error, and every GPU must stay usable (a plain GEMM after it right). The let-go calls'
// values are wrong by design and not checked. two_gpus: rank r on GPU r, every SM each (peer
// access enabled by the caller); else both on GPU 0, each GEMM on half of the SMs.
// Reduce-scatter and all-reduce.
void BreakCheck(bool two_gpus, cudaStream_t s) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Case c{4096, 4096, 1024, EvenBands(2048, 2, 256), GemmDType::kBFloat16};
  const int64_t rows = c.m / 2;
  for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
    const bool ar = kind == PeerReduceKind::kAllReduce;
    const int64_t out_bytes = (ar ? c.m : rows) * c.n * 2;
    EmulatedRank r0(0, rows, c.n, 0), r1(1, rows, c.n, two_gpus ? 1 : 0);
    EmulatedRank* ranks[2] = {&r0, &r1};
    CK(cudaSetDevice(0));
    r0.PeerWith(r1);
    r1.PeerWith(r0);
    Problem p({c.m, c.n, c.k}, c.dt, 888, s, /*with_ref=*/false);
    CK(cudaStreamSynchronize(s));
    std::unique_ptr<Buf> operands[2], results[2];  // rank r's x | w and result on its device
    SignalingGemmArgs g[2];
    for (int r = 0; r < 2; ++r) {
      CK(cudaSetDevice(ranks[r]->device));
      operands[r] = std::make_unique<Buf>((c.m * c.k + c.k * c.n) * 2);
      results[r] = std::make_unique<Buf>(out_bytes);
      char* x = static_cast<char*>(operands[r]->p);
      CK(cudaMemcpyPeer(x, ranks[r]->device, p.base.x, 0, c.m * c.k * 2));
      CK(cudaMemcpyPeer(x + c.m * c.k * 2, ranks[r]->device, p.base.w, 0, c.k * c.n * 2));
      g[r] = p.base;
      g[r].x = x;
      g[r].w = x + c.m * c.k * 2;
      g[r].comm_sms = two_gpus ? 0 : sms / 2;  // one GPU: the other half for the other rank
      g[r].layout = BandLayout(c.bands);
      g[r].queue = ranks[r]->queue->p;
    }
    int waited_ms = 0, break_ms = 0;
    bool first_ok = true;
    for (int r = 0; r < 2; ++r) {  // call 1: both ranks
      CK(cudaSetDevice(ranks[r]->device));
      Must(EnqueuePeerReduce(ranks[r]->r, ranks[r]->compute, kind, g[r], results[r]->p), "call 1");
    }
    for (int r = 0; r < 2; ++r) first_ok = first_ok && WaitStream(ranks[r]->compute, 10000, &waited_ms) == cudaSuccess;
    // Progress, flushed: a run killed from outside still says how far it got.
    printf("break %s: call 1 of both ranks %s\n", ar ? "AR" : "RS", first_ok ? "done" : "NOT DONE within 10 s");
    fflush(stdout);
    CK(cudaSetDevice(0));  // calls 2 and 3: rank 0 alone, then rank 1's failure path
    Must(EnqueuePeerReduce(r0.r, r0.compute, kind, g[0], results[0]->p), "call 2");
    Must(EnqueuePeerReduce(r0.r, r0.compute, kind, g[0], results[0]->p), "call 3");
    usleep(1000000);
    const bool waiting = cudaStreamQuery(r0.compute) == cudaErrorNotReady;  // the control
    CK(cudaSetDevice(r1.device));
    Must(EnqueueBreakPeers(r1.r, r1.compute), "EnqueueBreakPeers");
    printf("break %s: rank 0's calls 2 and 3 enqueued, waiting after 1 s: %s; rank 1's break enqueued\n",
           ar ? "AR" : "RS", waiting ? "yes" : "no");
    fflush(stdout);
    const cudaError_t end0 = WaitStream(r0.compute, 10000, &waited_ms);
    const cudaError_t end1 = WaitStream(r1.compute, 10000, &break_ms);
    printf("break %s: rank 0's stream %s, rank 1's %s; a plain GEMM next\n", ar ? "AR" : "RS",
           cudaGetErrorName(end0), cudaGetErrorName(end1));
    fflush(stdout);
    if (end0 == cudaErrorNotReady || end1 == cudaErrorNotReady) {  // a hung stream: stop here
      printf("break %s: a stream still runs 10 s after the break (rank 0: %s, rank 1: %s)  FAIL\n",
             ar ? "AR" : "RS", cudaGetErrorName(end0), cudaGetErrorName(end1));
      fflush(stdout);
      _exit(1);
    }
    bool after_ok = true;
    Verdict after{0, 0, 0};
    for (int d = 0; d < (two_gpus ? 2 : 1); ++d) {
      CK(cudaSetDevice(d));
      Verdict v;
      after_ok = PlainGemmRight(889 + d, &v) && after_ok;
      if (v.rel_err > after.rel_err || v.bad > after.bad) after = v;
    }
    CK(cudaSetDevice(0));
    const bool pass = first_ok && waiting && end0 == cudaSuccess && end1 == cudaSuccess && after_ok;
    printf("break %s: call 1 %s; rank 0's calls 2 and 3 alone still waiting after 1 s: %s; after rank 1 "
           "broke the pair: %s in %d ms; a GEMM after it on %s: rel %.2e, NaN %llu  %s\n",
           ar ? "AR" : "RS", first_ok ? "ok" : "FAILED", waiting ? "yes" : "NO", cudaGetErrorName(end0),
           waited_ms, two_gpus ? "each GPU" : "the GPU", after.rel_err, after.bad, pass ? "PASS" : "FAIL");
    fflush(stdout);
    g_failures += !pass;
    char buf[320];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"break\",\"kind\":\"%s\",\"two_gpus\":%s,\"waiting_after_1s\":%s,\"end\":\"%s\","
             "\"ms_after_break\":%d,\"after_rel_err\":%.3e,\"pass\":%s}",
             ar ? "all_reduce" : "reduce_scatter", two_gpus ? "true" : "false", waiting ? "true" : "false",
             cudaGetErrorName(end0), waited_ms, after.rel_err, pass ? "true" : "false");
    AddJson(buf);
  }
}

}  // namespace
