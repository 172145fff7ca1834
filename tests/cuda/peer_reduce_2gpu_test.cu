// The peer-store sequence (xla_ffi/comm/peer_reduce.h) on several GPUs, rank r on GPU r, its
// stores to the other ranks over NVLink (peer access enabled between every two): what
// peer_reduce_test can only emulate on one GPU. A group of --world GPUs (default 2, at most
// 8); needs that many with peer access (exit 2 without).
//   peer_reduce_2gpu_test check : reduce-scatter and all-reduce, each GPU's GEMM on every SM
//                                 (comm_sms 0), 4 calls back to back with fresh inputs, results
//                                 poisoned first: against float32 and bit for bit against the
//                                 ring's rounded running sum of the ranks' plain GEMMs (for 2,
//                                 NCCL's sum; peer_reduce_common)
//   peer_reduce_2gpu_test bench : per DESIGN.md shape (per-GPU M x N x K), our GEMM alone on
//                                 GPU 0 (all SMs), then every rank's sequence at once, 2 bands
//                                 per block, with the add ring (2 ranks) and with serial loads
//                                 (CUDA events on every GPU, the slowest per sample, median of
//                                 --iters samples of 5 calls)
//   peer_reduce_2gpu_test break   : a rank whose call failed breaks the pair (EnqueueBreakPeers):
//                                 the other rank's calls, two enqueued ahead, end with no
//                                 error, both GPUs stay usable (peer_reduce_common.cuh,
//                                 BreakCheck)
//                                 (always 2 GPUs)
// Options: --json PATH, --iters N (bench, default 15), --world N. Exit code 1 if a check failed.
#include "peer_reduce_common.cuh"

namespace {

// Peer access between every two of GPUs 0 .. world - 1, or exit 2 saying why.
void EnablePeerAccessAmong(int world) {
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < world) { fprintf(stderr, "needs %d GPUs, have %d\n", world, count); exit(2); }
  for (int d = 0; d < world; ++d) {
    CK(cudaSetDevice(d));
    for (int p = 0; p < world; ++p) {
      if (p == d) continue;
      int can = 0;
      CK(cudaDeviceCanAccessPeer(&can, d, p));
      if (!can) { fprintf(stderr, "GPU %d cannot access GPU %d's memory\n", d, p); exit(2); }
      const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else CK(e);
    }
  }
  CK(cudaSetDevice(0));
}

// Per case M x N x K and bands per block; M a multiple of 8 (every world size up to 8); the
// first case f16 with partial tiles.
void Check(cudaStream_t s, int world) {
  struct C { int64_t m, n, k; int groups; GemmDType dt; };
  const std::vector<C> cases = {{600, 272, 200, 2, GemmDType::kFloat16},
                                {2048, 1024, 512, 4, GemmDType::kBFloat16},
                                {4096, 8192, 4096, 2, GemmDType::kBFloat16},
                                {8192, 8192, 4096, 8, GemmDType::kBFloat16}};
  for (const C& c : cases) {
    const int64_t rows = c.m / world;
    const std::vector<int> bands = c.m == 600 ? std::vector<int>{0, int(rows / 3), int(rows)}
                                              : EvenBands(rows, std::min(c.groups, kMaxGroups / world), 256);
    const Case cs{c.m, c.n, c.k, bands, c.dt};
    for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce})
      CheckCase(cs, kind, 4, /*comm_sms=*/0, s, /*one_gpu_each=*/true, world);
  }
}

// Every rank's `calls` sequences enqueued (rank by rank per call), timed by events on each
// GPU's stream: the slowest GPU's ms per call.
float TimeGroup(const std::vector<EmulatedRank*>& ranks, PeerReduceKind kind, const std::vector<SignalingGemmArgs>& g,
                const std::vector<void*>& result, int calls) {
  const int world = int(ranks.size());
  std::vector<cudaEvent_t> start(world), stop(world);
  for (int r = 0; r < world; ++r) {
    CK(cudaSetDevice(ranks[r]->device));
    CK(cudaEventCreate(&start[r]));
    CK(cudaEventCreate(&stop[r]));
    CK(cudaEventRecord(start[r], ranks[r]->compute));
  }
  for (int i = 0; i < calls; ++i) {
    for (int r = 0; r < world; ++r) {
      CK(cudaSetDevice(ranks[r]->device));
      Must(EnqueuePeerReduce(ranks[r]->r, ranks[r]->compute, kind, g[r], result[r]), "EnqueuePeerReduce");
    }
  }
  float worst = 0;
  for (int r = 0; r < world; ++r) {
    CK(cudaSetDevice(ranks[r]->device));
    CK(cudaEventRecord(stop[r], ranks[r]->compute));
    CK(cudaEventSynchronize(stop[r]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start[r], stop[r]));
    worst = std::max(worst, ms / calls);
    CK(cudaEventDestroy(start[r]));
    CK(cudaEventDestroy(stop[r]));
  }
  CK(cudaSetDevice(0));
  return worst;
}

void Bench(cudaStream_t s, int* counters, int iters, int world) {
  constexpr int kCallsPerSample = 5;
  printf("%-18s | %7s | %7s %7s %7s %7s | %s\n", "per-GPU M x N x K", "GEMM", "RS", "RS ser", "AR", "AR ser",
         "over GEMM: RS, RS serial, AR, AR serial");
  uint64_t seed = 60000;
  for (const Shape3& c : kDesignShapes) {
    const GemmDType dt = GemmDType::kBFloat16;
    const int64_t rows = c.m / world;
    // Rank r's operands on GPU r (the same values on every GPU: what matters here is time).
    std::vector<std::unique_ptr<EmulatedRank>> owned(world);
    std::vector<std::unique_ptr<Problem>> problem(world);
    std::vector<std::unique_ptr<Buf>> result(world);
    std::vector<EmulatedRank*> ranks(world);
    std::vector<void*> out(world);
    for (int r = 0; r < world; ++r) {
      owned[r] = std::make_unique<EmulatedRank>(r, rows, c.n, r, world);
      ranks[r] = owned[r].get();
      problem[r] = std::make_unique<Problem>(c, dt, seed, ranks[r]->compute, /*with_ref=*/false);
      result[r] = std::make_unique<Buf>(c.m * c.n * 2);
      out[r] = result[r]->p;
      CK(cudaStreamSynchronize(ranks[r]->compute));
    }
    seed += 10;
    CK(cudaSetDevice(0));
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < world; ++i)
        if (i != r) ranks[r]->PeerWith(*ranks[i]);
    SignalingGemmArgs whole = problem[0]->Args(EvenLayout(c.m, 1, 1, 256), 0);
    whole.counters = counters;
    whole.queue = ranks[0]->queue->p;
    const double gm = TimeInterleaved({[&]() {
      for (int i = 0; i < kCallsPerSample; ++i) {
        CK(cudaMemsetAsync(counters, 0, sizeof(int) * kMaxGroups, s));
        MustLaunch(LaunchSignalingGemm(whole, s), "GEMM");
      }
    }}, s, iters)[0] / kCallsPerSample;
    std::vector<float> seq_ms[4];
    for (int it = 0; it < iters + 2; ++it) {  // the first 2: warm-up
      int v = 0;
      for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
        for (bool serial : {false, true}) {
          std::vector<SignalingGemmArgs> g(world);
          for (int r = 0; r < world; ++r) {
            g[r] = problem[r]->base;
            g[r].layout = BandLayout(EvenBands(rows, 2, 256));
            g[r].queue = ranks[r]->queue->p;
            g[r].add_serial = serial;
          }
          seq_ms[v++].push_back(TimeGroup(ranks, kind, g, out, kCallsPerSample));
        }
      }
    }
    auto median = [](std::vector<float> v) {
      v.erase(v.begin(), v.begin() + 2);  // warm-up
      std::sort(v.begin(), v.end());
      return double(v[v.size() / 2]);
    };
    double ms[4];
    for (int v = 0; v < 4; ++v) ms[v] = median(seq_ms[v]);
    char shape[40];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
    printf("%-18s | %7.3f | %7.3f %7.3f %7.3f %7.3f | %.3f %.3f %.3f %.3f\n", shape, gm, ms[0], ms[1], ms[2], ms[3],
           ms[0] / gm, ms[1] / gm, ms[2] / gm, ms[3] / gm);
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"tag\":\"bench2\",\"world\":%d,\"m\":%lld,\"n\":%lld,\"k\":%lld,\"gemm_ms\":%.4f,\"reduce_scatter_ms\":%.4f,"
             "\"reduce_scatter_add_serial_ms\":%.4f,\"all_reduce_ms\":%.4f,\"all_reduce_add_serial_ms\":%.4f}",
             world, (long long)c.m, (long long)c.n, (long long)c.k, gm, ms[0], ms[1], ms[2], ms[3]);
    AddJson(buf);
    fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  if (o.mode != "check" && o.mode != "bench" && o.mode != "break" && o.mode != "all") {
    fprintf(stderr, "unknown mode %s (check, bench, break, all)\n", o.mode.c_str());
    return 2;
  }
  if (8 % o.world != 0) {  // the cases' M (multiples of 8) split into equal blocks
    fprintf(stderr, "--world must be 2, 4 or 8, got %d\n", o.world);
    return 2;
  }
  EnablePeerAccessAmong(o.world);
  TestDevice d = StartTestDevice();
  if (o.mode == "check" || o.mode == "all") Check(d.stream, o.world);
  if (o.mode == "bench" || o.mode == "all") Bench(d.stream, d.counters, o.iters, o.world);
  if (o.mode == "break" || o.mode == "all") BreakCheck(/*one_gpu_each=*/true, d.stream);
  char fields[64];
  snprintf(fields, sizeof fields, ",\"iters\":%d,\"world\":%d", o.iters, o.world);
  return FinishTest(d, o.mode, o.json_path, fields);
}
