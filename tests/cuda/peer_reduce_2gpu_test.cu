// The peer-store sequence (xla_ffi/comm/peer_reduce.h) on two GPUs, rank r on GPU r, its
// stores to the peer over NVLink (peer access enabled both ways): what peer_reduce_test can
// only emulate on one GPU. Needs 2 GPUs with peer access (exit 2 without).
//   peer_reduce_2gpu_test check : reduce-scatter and all-reduce, each GPU's GEMM on every SM
//                                 (comm_sms 0), 4 calls back to back with fresh inputs, results
//                                 poisoned first: against float32 and bit for bit against the
//                                 NCCL-style rounded sum of two plain GEMMs (peer_reduce_common)
//   peer_reduce_2gpu_test bench : per DESIGN.md shape (per-GPU M x N x K), our GEMM alone on
//                                 GPU 0 (all SMs), then both ranks' sequences at once, 2 bands
//                                 per block, with the add ring and with serial loads (CUDA
//                                 events on both GPUs, the slower of the two per sample, median
//                                 of --iters samples of 5 calls)
//   peer_reduce_2gpu_test break   : a rank whose call failed breaks the pair (EnqueueBreakPeers):
//                                 the other rank's calls, two enqueued ahead, end with no
//                                 error, both GPUs stay usable (peer_reduce_common.cuh,
//                                 BreakCheck)
// Options: --json PATH, --iters N (bench, default 15). Exit code 1 if a check failed.
#include "peer_reduce_common.cuh"

namespace {

// Peer access both ways between GPUs 0 and 1, or exit 2 saying why.
void EnablePeerAccessBothWays() {
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < 2) { fprintf(stderr, "needs 2 GPUs, have %d\n", count); exit(2); }
  for (int d = 0; d < 2; ++d) {
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, d, 1 - d));
    if (!can) { fprintf(stderr, "GPU %d cannot access GPU %d's memory\n", d, 1 - d); exit(2); }
    CK(cudaSetDevice(d));
    const cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    else CK(e);
  }
  CK(cudaSetDevice(0));
}

void Check(cudaStream_t s) {
  const std::vector<Case> cases = {
      {600, 272, 200, {0, 100, 300}, GemmDType::kFloat16},
      {2048, 1024, 512, EvenBands(1024, 4, 256), GemmDType::kBFloat16},
      {4096, 8192, 4096, EvenBands(2048, 2, 256), GemmDType::kBFloat16},
      {8192, 8192, 4096, EvenBands(4096, 8, 256), GemmDType::kBFloat16},
  };
  for (const Case& c : cases)
    for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce})
      CheckCase(c, kind, 4, /*comm_sms=*/0, s, /*one_gpu_each=*/true);
}

// Both ranks' `calls` sequences enqueued (alternating), timed by events on each GPU's stream:
// the slower GPU's ms per call.
float TimePair(EmulatedRank* ranks[2], PeerReduceKind kind, const SignalingGemmArgs g[2], void* const result[2],
               int calls) {
  cudaEvent_t start[2], stop[2];
  for (int r = 0; r < 2; ++r) {
    CK(cudaSetDevice(ranks[r]->device));
    CK(cudaEventCreate(&start[r]));
    CK(cudaEventCreate(&stop[r]));
    CK(cudaEventRecord(start[r], ranks[r]->compute));
  }
  for (int i = 0; i < calls; ++i) {
    for (int r = 0; r < 2; ++r) {
      CK(cudaSetDevice(ranks[r]->device));
      Must(EnqueuePeerReduce(ranks[r]->r, ranks[r]->compute, kind, g[r], result[r]), "EnqueuePeerReduce");
    }
  }
  float worst = 0;
  for (int r = 0; r < 2; ++r) {
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

void Bench(cudaStream_t s, int* counters, int iters) {
  struct B { int64_t m, n, k; };
  const std::vector<B> cases = {{4096, 8192, 4096}, {8192, 8192, 4096}, {16384, 8192, 8192},
                                {8192, 28672, 4096}, {8192, 8192, 14336}};
  constexpr int kCallsPerSample = 5;
  printf("%-18s | %7s | %7s %7s %7s %7s | %s\n", "per-GPU M x N x K", "GEMM", "RS", "RS ser", "AR", "AR ser",
         "over GEMM: RS, RS serial, AR, AR serial");
  uint64_t seed = 60000;
  for (const B& c : cases) {
    const GemmDType dt = GemmDType::kBFloat16;
    const int64_t rows = c.m / 2;
    // Rank r's operands on GPU r (the same values on both: what matters here is time).
    std::unique_ptr<EmulatedRank> owned[2];
    std::unique_ptr<Problem> problem[2];
    std::unique_ptr<Buf> result[2];
    EmulatedRank* ranks[2];
    for (int r = 0; r < 2; ++r) {
      owned[r] = std::make_unique<EmulatedRank>(r, rows, c.n, r);
      ranks[r] = owned[r].get();
      problem[r] = std::make_unique<Problem>(Shape3{c.m, c.n, c.k}, dt, seed, ranks[r]->compute, /*with_ref=*/false);
      result[r] = std::make_unique<Buf>(c.m * c.n * 2);
      CK(cudaStreamSynchronize(ranks[r]->compute));
    }
    seed += 10;
    CK(cudaSetDevice(0));
    ranks[0]->PeerWith(*ranks[1]);
    ranks[1]->PeerWith(*ranks[0]);
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
    void* const out[2] = {result[0]->p, result[1]->p};
    for (int it = 0; it < iters + 2; ++it) {  // the first 2: warm-up
      int v = 0;
      for (PeerReduceKind kind : {PeerReduceKind::kReduceScatter, PeerReduceKind::kAllReduce}) {
        for (bool serial : {false, true}) {
          SignalingGemmArgs g[2];
          for (int r = 0; r < 2; ++r) {
            g[r] = problem[r]->base;
            g[r].layout = BandLayout(EvenBands(rows, 2, 256));
            g[r].queue = ranks[r]->queue->p;
            g[r].add_serial = serial;
          }
          seq_ms[v++].push_back(TimePair(ranks, kind, g, out, kCallsPerSample));
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
             "{\"tag\":\"bench2\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"gemm_ms\":%.4f,\"reduce_scatter_ms\":%.4f,"
             "\"reduce_scatter_add_serial_ms\":%.4f,\"all_reduce_ms\":%.4f,\"all_reduce_add_serial_ms\":%.4f}",
             (long long)c.m, (long long)c.n, (long long)c.k, gm, ms[0], ms[1], ms[2], ms[3]);
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
  EnablePeerAccessBothWays();
  TestDevice d = StartTestDevice();
  if (o.mode == "check" || o.mode == "all") Check(d.stream);
  if (o.mode == "bench" || o.mode == "all") Bench(d.stream, d.counters, o.iters);
  if (o.mode == "break" || o.mode == "all") BreakCheck(/*one_gpu_each=*/true, d.stream);
  char fields[64];
  snprintf(fields, sizeof fields, ",\"iters\":%d", o.iters);
  return FinishTest(d, o.mode, o.json_path, fields);
}
