// The stock CUTLASS kernel behind tile_probe.h's StockGemm: CUTLASS's collective builders
// (TMA + wgmma mainloop, TMA epilogue with no source matrix), its persistent tile scheduler
// with the default raster heuristic, stages from the shared memory the epilogue leaves.
// Included by one tile_probe_*.cu per instantiation.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "tile_probe.h"

namespace tile_probe {

// kStages 0: as many mainloop stages as the shared memory the epilogue leaves holds.
template <int kBlockM, int kBlockN, int kClusterM, int kClusterN, class KernelSchedule,
          class EpilogueSchedule, int kStages = 0>
class CutlassGemm final : public StockGemm {
  using Element = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  // ElementC void: beta is 0, so the epilogue loads no source matrix.
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, 8,
      Element, cutlass::layout::RowMajor, 8, EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, 8,   // x [M, K]: K-major
      Element, cutlass::layout::RowMajor, 8,   // w [K, N]: N-major
      float, TileShape, ClusterShape,
      std::conditional_t<kStages == 0,
                         cutlass::gemm::collective::StageCountAutoCarveout<
                             static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
                         cutlass::gemm::collective::StageCount<kStages>>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

 public:
  explicit CutlassGemm(const char* name) : name_(name) {}
  ~CutlassGemm() override { cudaFree(workspace_); }

  bool Init(const void* x, const void* w, void* out, int m, int n, int k, int sms,
            cudaStream_t stream, std::string* error) override {
    using cutlass::make_cute_packed_stride;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = sms;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Element*>(x),
         make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(m, k, 1)),
         static_cast<const Element*>(w),
         make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(n, k, 1))},
        {{1.0f, 0.0f}, nullptr,
         make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(m, n, 1)),
         static_cast<Element*>(out),
         make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(m, n, 1))},
        hw};
    if (gemm_.can_implement(args) != cutlass::Status::kSuccess) {
      *error = "can_implement refused the shape";
      return false;
    }
    const size_t bytes = Gemm::get_workspace_size(args);
    if (bytes > 0 && cudaMalloc(&workspace_, bytes) != cudaSuccess) {
      *error = "workspace allocation failed";
      return false;
    }
    const cutlass::Status st = gemm_.initialize(args, workspace_, stream);
    if (st != cutlass::Status::kSuccess) {
      *error = cutlassGetStatusString(st);
      return false;
    }
    return true;
  }

  cudaError_t Run(cudaStream_t stream) override {
    return gemm_.run(stream) == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
  }
  const char* Name() const override { return name_; }
  int Stages() const override { return Mainloop::DispatchPolicy::Stages; }

 private:
  const char* name_;
  Gemm gemm_;
  void* workspace_ = nullptr;
};

}  // namespace tile_probe
