// Stock CUTLASS GEMMs for tile_probe.cu: which tile and cluster shape of CUTLASS's own
// persistent warp-specialized kernel runs the per-GPU shapes fastest on this GPU, next to
// cuBLAS and our signaling GEMM (docs/signaling_gemm.md, "On an H100": the question is
// whether a 256 x 128 tile is worth an instance of ours). One instantiation per .cu
// (tile_probe_<schedule>_<tile>_<cluster>.cu), ~60-90 s of nvcc each.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace tile_probe {

// One stock kernel on fixed bf16 operands: x [M, K] and w [K, N] row-major, out [M, N].
class StockGemm {
 public:
  virtual ~StockGemm() = default;
  // Builds the kernel's arguments and workspace; false (with `error` set) when CUTLASS
  // cannot run this shape.
  virtual bool Init(const void* x, const void* w, void* out, int m, int n, int k, int sms,
                    cudaStream_t stream, std::string* error) = 0;
  // One launch with the arguments Init built.
  virtual cudaError_t Run(cudaStream_t stream) = 0;
  virtual const char* Name() const = 0;
  virtual int Stages() const = 0;  // the mainloop's
};

std::unique_ptr<StockGemm> MakeCooperative128x256Cluster2x1();
std::unique_ptr<StockGemm> MakeCooperative256x128Cluster1x2();
std::unique_ptr<StockGemm> MakeCooperative256x128Cluster2x1();
// Our tile and cluster with our overlapped epilogue's 3 mainloop stages (the stock kernel
// takes 4 at 128 x 256): does the stage count account for ours' gap?
std::unique_ptr<StockGemm> MakeCooperative128x256Cluster2x1Stages3();

}  // namespace tile_probe
