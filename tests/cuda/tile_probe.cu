// Which tile shape wants an instance of ours on this GPU (one GPU, no NCCL)?
//
// On an H100 our cooperative 128 x 256 kernel runs the smaller per-GPU shapes 4-6% behind
// cuBLAS's cooperative 256 x 128 (1x2 cluster) kernel, with the same tile area
// (docs/signaling_gemm.md, "On an H100"). Before building a 256 x 128 instance of ours (which
// changes the rows every group plan aligns to), this probe asks the same question of stock
// CUTLASS, whose mainloop collective ours uses: does CUTLASS's own kernel gain from 256 x 128
// tiles here, and with which cluster shape? Variants, interleaved per round (a batch of
// back-to-back launches each, CUDA events, median over rounds; the rounds' orders a balanced
// Latin square, so none keeps one place in the round or one predecessor):
//   cublas                     cublasGemmEx (its heuristic's kernel)
//   ours                       our signaling GEMM, 4 groups, signals on, comm_sms 0, tile queue
//   ours_<what>                the same with settings changed (kOursVariants: one group, the
//                              round-robin order, whole units only, the sync epilogue, the
//                              epilogue staged in halves, panels, and some at comm_sms 16)
//   cutlass_coop_128x256_2x1   stock CUTLASS, our tile and cluster
//   cutlass_coop_256x128_1x2   stock CUTLASS, cuBLAS's H100 tile and cluster
//   cutlass_coop_256x128_2x1   the same tile, clusters along M
//   cutlass_coop_128x256_2x1_3_stages  our tile with our mainloop's 3 stages (stock: 4)
// Every variant's output is poisoned first and compared with an fp32 reference.
//
//   tests/cuda/build_tile_probe.sh [BUILD_DIR];  BUILD_DIR/tile_probe [out.json]
#include <memory>
#include <utility>

#include "gemm_test_common.cuh"
#include "tile_probe.h"

namespace {

struct Variant {
  std::string name;
  std::function<cudaError_t()> launch;
  std::vector<int> dst;  // output row of each logical row
  float ms = 0;
  double rel_err = -1;
  unsigned long long bad = 0, wrong = 0;
};

// Our kernel with one setting changed: its launcher reads these switches at every launch.
struct OursVariant {
  const char* name;
  int groups;
  bool queue;
  int comm_sms;
  std::vector<std::pair<const char*, const char*>> env;
};
const OursVariant kOursVariants[] = {
    {"ours", 4, true, 0, {}},
    {"ours_1_group", 1, true, 0, {}},
    {"ours_round_robin", 4, false, 0, {}},
    {"ours_whole_tail", 4, true, 0, {{"FLASHOVERLAP_GEMM_TAIL", "whole"}}},
    {"ours_sync_epilogue", 4, true, 0, {{"FLASHOVERLAP_GEMM_EPILOGUE", "sync"}}},
    {"ours_panel_2", 4, true, 0, {{"FLASHOVERLAP_GEMM_PANEL", "2"}}},
    {"ours_panel_32", 4, true, 0, {{"FLASHOVERLAP_GEMM_PANEL", "32"}}},
    {"ours_sync_panel_32", 4, true, 0,
     {{"FLASHOVERLAP_GEMM_EPILOGUE", "sync"}, {"FLASHOVERLAP_GEMM_PANEL", "32"}}},
    {"ours_round_robin_sync_panel_32", 4, false, 0,
     {{"FLASHOVERLAP_GEMM_EPILOGUE", "sync"}, {"FLASHOVERLAP_GEMM_PANEL", "32"}}},
    {"ours_halves", 4, true, 0, {{"FLASHOVERLAP_GEMM_EPILOGUE", "halves"}}},
    {"ours_halves_panel_32", 4, true, 0,
     {{"FLASHOVERLAP_GEMM_EPILOGUE", "halves"}, {"FLASHOVERLAP_GEMM_PANEL", "32"}}},
    // 16 SMs left to communication, as the overlapped ops do (the grid is smaller; nothing
    // runs on those SMs here):
    {"ours_cs16", 4, true, 16, {}},
    {"ours_cs16_round_robin", 4, false, 16, {}},
    {"ours_cs16_sync_epilogue", 4, true, 16, {{"FLASHOVERLAP_GEMM_EPILOGUE", "sync"}}},
    {"ours_cs16_panel_32", 4, true, 16, {{"FLASHOVERLAP_GEMM_PANEL", "32"}}},
    {"ours_cs16_sync_panel_32", 4, true, 16,
     {{"FLASHOVERLAP_GEMM_EPILOGUE", "sync"}, {"FLASHOVERLAP_GEMM_PANEL", "32"}}},
    {"ours_cs16_halves", 4, true, 16, {{"FLASHOVERLAP_GEMM_EPILOGUE", "halves"}}},
    {"ours_cs16_halves_panel_32", 4, true, 16,
     {{"FLASHOVERLAP_GEMM_EPILOGUE", "halves"}, {"FLASHOVERLAP_GEMM_PANEL", "32"}}},
};

std::vector<int> IdentityRows(int64_t m) {
  std::vector<int> rows(m);
  for (int64_t r = 0; r < m; ++r) rows[r] = int(r);
  return rows;
}

// Poison, one launch, then the relative L2 error, non-finite and off-tolerance counts.
void Check(Variant& v, void* out, const float* ref, const Shape3& sh, cudaStream_t s) {
  CK(cudaMemsetAsync(out, 0xFF, sh.m * sh.n * 2, s));
  CK(v.launch());
  Buf dst(sh.m * sizeof(int)), acc(2 * sizeof(double)), bad(sizeof(unsigned long long)),
      wrong(sizeof(unsigned long long));
  CK(cudaMemcpyAsync(dst.p, v.dst.data(), sh.m * sizeof(int), cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(acc.p, 0, acc.bytes, s));
  CK(cudaMemsetAsync(bad.p, 0, bad.bytes, s));
  CK(cudaMemsetAsync(wrong.p, 0, wrong.bytes, s));
  ErrorStats<<<1024, 256, 0, s>>>((const __nv_bfloat16*)out, ref, (const int*)dst.p, sh.m, sh.n,
                                  (double*)acc.p, (unsigned long long*)bad.p);
  CountWrong<<<1024, 256, 0, s>>>((const __nv_bfloat16*)out, ref, (const int*)dst.p, sh.m, sh.n,
                                  0.02f, 0.5f, (unsigned long long*)wrong.p);
  CK(cudaGetLastError());
  double h[2];
  CK(cudaMemcpyAsync(h, acc.p, sizeof h, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&v.bad, bad.p, sizeof v.bad, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&v.wrong, wrong.p, sizeof v.wrong, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  v.rel_err = std::sqrt(h[0] / h[1]);
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = argc > 1 ? argv[1] : nullptr;
  TestDevice d = StartTestDevice();
  cudaStream_t s = d.stream;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  Cublas cublas;
  cublas.Load();
  if (!cublas.ok()) return 2;
  std::string table;
  for (const Shape3& sh : kDesignShapes) {
    const int M = int(sh.m), N = int(sh.n), K = int(sh.k);
    Buf x(sh.m * sh.k * 2), w(sh.k * sh.n * 2), out(sh.m * sh.n * 2), ref(sh.m * sh.n * 4);
    Fill(x.p, sh.m * sh.k, GemmDType::kBFloat16, 21, s);
    Fill(w.p, sh.k * sh.n, GemmDType::kBFloat16, 22, s);
    Reference(x.p, w.p, (float*)ref.p, M, N, K, GemmDType::kBFloat16, s);

    std::vector<Variant> vs;
    vs.push_back({"cublas", [&] {
                    return cublas.Run(x.p, w.p, out.p, M, N, K, GemmDType::kBFloat16, s) == 0
                               ? cudaSuccess : cudaErrorLaunchFailure;
                  }, IdentityRows(sh.m)});
    for (const OursVariant& ov : kOursVariants) {
      SignalingGemmArgs a;
      a.x = x.p; a.w = w.p; a.out = out.p;
      a.m = sh.m; a.n = sh.n; a.k = sh.k;
      a.layout = EvenLayout(sh.m, 1, ov.groups, 256);
      a.counters = d.counters;  // not reset between launches: nothing here waits on them
      a.queue = ov.queue ? GemmQueue() : nullptr;
      a.comm_sms = ov.comm_sms;
      vs.push_back({ov.name, [a, s, &ov] {
                      for (const auto& kv : ov.env) setenv(kv.first, kv.second, 1);
                      const cudaError_t e = LaunchSignalingGemm(a, s);
                      for (const auto& kv : ov.env) unsetenv(kv.first);
                      if (e != cudaSuccess) fprintf(stderr, "%s: %s\n", ov.name, LastSignalingGemmError());
                      return e;
                    }, DstRows(sh.m, a.layout)});
    }
    std::vector<std::unique_ptr<tile_probe::StockGemm>> stock;
    stock.push_back(tile_probe::MakeCooperative128x256Cluster2x1());
    stock.push_back(tile_probe::MakeCooperative256x128Cluster1x2());
    stock.push_back(tile_probe::MakeCooperative256x128Cluster2x1());
    stock.push_back(tile_probe::MakeCooperative128x256Cluster2x1Stages3());
    for (auto& g : stock) {
      std::string error;
      if (!g->Init(x.p, w.p, out.p, M, N, K, prop.multiProcessorCount, s, &error)) {
        fprintf(stderr, "%s at %dx%dx%d: %s\n", g->Name(), M, N, K, error.c_str());
        ++g_failures;
        continue;
      }
      tile_probe::StockGemm* p = g.get();
      if (&sh == &kDesignShapes[0]) printf("%s: %d mainloop stages\n", p->Name(), p->Stages());
      vs.push_back({p->Name(), [p, s] { return p->Run(s); }, IdentityRows(sh.m)});
    }
    for (Variant& v : vs) {
      Check(v, out.p, (const float*)ref.p, sh, s);
      // bf16 output of K-long fp32 sums: rounding alone is ~2e-3 relative.
      if (v.bad || v.wrong || !(v.rel_err < 5e-3)) {
        fprintf(stderr, "%s at %dx%dx%d: rel err %.2e, %llu non-finite, %llu off tolerance\n",
                v.name.c_str(), M, N, K, v.rel_err, v.bad, v.wrong);
        ++g_failures;
      }
    }
    const int batch = sh.m * sh.n * sh.k > (int64_t(1) << 38) ? 5 : 10;
    std::vector<std::function<void()>> runs;
    for (Variant& v : vs)
      runs.push_back([&v, batch] { for (int b = 0; b < batch; ++b) CK(v.launch()); });
    const std::vector<float> med = TimeInterleaved(runs, s, 21);
    const double flop = 2.0 * sh.m * sh.n * sh.k;
    for (size_t i = 0; i < vs.size(); ++i) {
      Variant& v = vs[i];
      v.ms = med[i] / batch;
      char buf[512];
      snprintf(buf, sizeof buf,
               "{\"m\":%d,\"n\":%d,\"k\":%d,\"variant\":\"%s\",\"ms\":%.4f,\"tflops\":%.1f,"
               "\"cublas_over_this\":%.3f,\"rel_err\":%.3e,\"non_finite\":%llu,\"off_tolerance\":%llu}",
               M, N, K, v.name.c_str(), v.ms, flop / v.ms * 1e-9, vs[0].ms / v.ms, v.rel_err, v.bad, v.wrong);
      AddJson(buf);
      char line[256];
      snprintf(line, sizeof line, "%6dx%6dx%6d  %-26s %.4f ms (%4.0f TF/s)  cublas/this %.3f  err %.1e\n",
               M, N, K, v.name.c_str(), v.ms, flop / v.ms * 1e-9, vs[0].ms / v.ms, v.rel_err);
      table += line;
    }
  }
  printf("==== tile shapes (bf16; median of 21 interleaved rounds, balanced order, of batched launches) ====\n%s",
         table.c_str());
  return FinishTest(d, "tile_probe", json_path ? json_path : "",
                    std::string(",\"device\":\"") + prop.name + "\",\"sms\":" +
                        std::to_string(prop.multiProcessorCount));
}
