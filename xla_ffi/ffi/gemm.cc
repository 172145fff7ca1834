// XLA FFI handler flashoverlap_gemm: the signaling GEMM on its own (no communication), so
// that the kernel, its group layout and its signals are exercised and timed from JAX.
// Decodes and validates the buffers, splits M into `num_groups` row bands, takes the
// group counters from XLA's scratch allocator, and launches on XLA's stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "../kernels/signaling_gemm.h"
#include "check.h"
#include "gemm_operands.h"
#include "handlers.h"
#include "poison.h"
#include "xla/ffi/api/ffi.h"

namespace flashoverlap {
namespace {

// M rows -> `num_groups` bands of whole row_align units (block_m * cluster_m rows, so no
// cluster is left half idle); units spread as evenly as possible, the last band may be
// partial. Fewer bands than asked when M has fewer units than that.
int SplitRows(int64_t m, int num_groups, int row_align, GroupLayout* layout) {
  const int64_t units = (m + row_align - 1) / row_align;
  int64_t groups = num_groups < units ? num_groups : units;
  if (groups < 1) groups = 1;
  layout->num_blocks = 1;
  layout->num_groups = int(groups);
  for (int64_t g = 0; g <= groups; ++g) {
    const int64_t rows = (units * g / groups) * row_align;
    layout->band_rows[g] = int(rows < m ? rows : m);
  }
  return int(groups);
}

ffi::Error GemmImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                    ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int32_t comm_sms,
                    int32_t num_groups, int32_t transpose_w, int32_t poison_outputs) {
  constexpr const char* kOp = "flashoverlap_gemm";
  FO_RETURN_IF_ERROR(CheckGemmOperands(kOp, x, w, *out, transpose_w));
  const int64_t m = x.dimensions()[0], k = x.dimensions()[1], n = GemmN(w, transpose_w);
  const auto od = out->dimensions();
  FO_CHECK_ARG(od[0] == m && od[1] == n,
               kOp << ": out must be [" << m << "," << n << "], got [" << od[0] << "," << od[1] << "]");
  FO_CHECK_ARG(m >= 1 && n >= 8 && k >= 8,
               kOp << ": need M >= 1 and N, K positive multiples of 8; got M=" << m << " N=" << n
                   << " K=" << k);
  FO_CHECK_ARG(num_groups >= 1 && num_groups <= kMaxGroups,
               kOp << ": num_groups must be in [1, " << kMaxGroups << "], got " << num_groups);
  FO_CHECK_ARG(comm_sms >= 0, kOp << ": comm_sms must be >= 0, got " << comm_sms);
  FO_RETURN_IF_ERROR(PoisonResults(kOp, poison_outputs, stream, {&*out}));

  SignalingGemmArgs args = GemmArgs(x.untyped_data(), m, w, transpose_w, out->untyped_data(),
                                    /*counters=*/nullptr, comm_sms);
  const GemmTileShape ts = ChooseTileShape(args);
  const int groups = SplitRows(m, num_groups, ts.row_align(), &args.layout);

  // One scratch allocation for this call: the group counters, then the tile queue's
  // workspace (the launcher resets it on `stream`). Valid until the handler returns, and
  // everything using it is ordered on `stream`.
  // (16-byte alignment: XLA's scratch allocator refuses more than its allocator alignment.)
  constexpr size_t kCounterBytes = 256;  // kMaxGroups int32, keeps the queue 16-byte aligned
  static_assert(sizeof(int32_t) * kMaxGroups <= kCounterBytes, "counters overlap the queue");
  std::optional<void*> mem = scratch.Allocate(kCounterBytes + kGemmQueueBytes, 16);
  FO_CHECK(mem.has_value(), "flashoverlap_gemm: scratch allocation of the group counters and tile "
                            "queue (" << kCounterBytes + kGemmQueueBytes << " bytes) failed");
  args.counters = static_cast<int32_t*>(*mem);
  args.queue = static_cast<char*>(*mem) + kCounterBytes;
  const cudaError_t zeroed = cudaMemsetAsync(args.counters, 0, sizeof(int32_t) * groups, stream);
  FO_CHECK(zeroed == cudaSuccess, kOp << ": zeroing the group counters (cudaMemsetAsync) failed: "
                                      << cudaGetErrorName(zeroed) << " (" << cudaGetErrorString(zeroed) << ")");

  const cudaError_t e = LaunchSignalingGemm(args, stream);
  FO_CHECK_ARG(e != cudaErrorInvalidValue, "flashoverlap_gemm: " << LastSignalingGemmError());
  if (e == cudaErrorNotSupported) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      FormatError(__FILE__, __LINE__, std::string("flashoverlap_gemm: ") + LastSignalingGemmError()));
  }
  FO_CHECK(e == cudaSuccess, "flashoverlap_gemm: " << LastSignalingGemmError() << " (" << cudaGetErrorName(e) << ")");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapGemm,
                              flashoverlap::NoThrow("flashoverlap_gemm", flashoverlap::GemmImpl),
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::ScratchAllocator>()
                                  .Arg<xla::ffi::AnyBuffer>()  // x [M, K]
                                  .Arg<xla::ffi::AnyBuffer>()  // w [K, N] (or [N, K])
                                  .Ret<xla::ffi::AnyBuffer>()  // out [M, N]
                                  .Attr<int32_t>("comm_sms")
                                  .Attr<int32_t>("num_groups")
                                  .Attr<int32_t>("transpose_w")
                                  .Attr<int32_t>("poison_outputs"));
