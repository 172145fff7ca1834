// flashoverlap_collective: the communication half of an overlapped op alone, for measuring
// (bench "nccl_capped"): the same NCCL call(s) on our capped communicator, over its
// registered workspace, on our stream, then the all-reduce's copy to the output on the copy
// stream, as in the overlapped op (xla_ffi/comm/gemm_collective_call.cc). No GEMM:
// the values are the workspace's current contents, so the output is meaningless; only the
// time is. CollectiveImpl -> FlashoverlapCollective -> "flashoverlap_collective".
#include <cuda_runtime.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/comm_call.h"
#include "xla_ffi/ffi/handlers.h"

namespace flashoverlap {
namespace {

ffi::Error CollectiveImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer y,
                          ffi::Result<ffi::AnyBuffer> out, int64_t comm_id, int32_t world_size,
                          int32_t reduce_scatter, int32_t num_groups) {
  const char* op = "flashoverlap_collective";
  Communicator* comm = FindCommunicator(comm_id, device);
  FO_RETURN_IF_ERROR(CheckCommunicator(op, comm, world_size, comm_id, device));
  FO_CHECK_ARG(reduce_scatter == 0 || reduce_scatter == 1,
               op << ": reduce_scatter must be 0 or 1, got " << reduce_scatter);
  auto dtype = y.element_type();
  FO_CHECK_ARG(dtype == ffi::DataType::BF16 || dtype == ffi::DataType::F16,
               op << ": y must be bfloat16 or float16");
  auto yd = y.dimensions();
  FO_CHECK_ARG(yd.size() == 2, op << ": y must be 2-D");
  const int64_t m = yd[0], n = yd[1];
  FO_CHECK_ARG(num_groups >= 1 && m % (int64_t(num_groups) * world_size) == 0,
               op << ": M=" << m << " must split into " << num_groups << " x " << world_size);
  FO_CHECK_ARG(num_groups <= kMaxGroups, op << ": at most " << kMaxGroups << " groups");
  // Every group's result is written to the output: it must hold all of them.
  const int64_t out_elems = reduce_scatter ? m / world_size * n : m * n;
  FO_CHECK_ARG(out->element_type() == dtype &&
                   out->element_count() == static_cast<size_t>(out_elems),
               op << ": the output must hold " << out_elems << " elements of y's dtype, got "
                  << out->element_count());
  const CollectiveKind kind =
      reduce_scatter ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
  return ToFfiError(RunCollectiveOnly(*comm, stream, kind, m, n,
                                      dtype == ffi::DataType::BF16 ? GemmDType::kBFloat16
                                                                   : GemmDType::kFloat16,
                                      num_groups, out->untyped_data(), op));
}

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapCollective,
                              flashoverlap::NoThrow("flashoverlap_collective",
                                                    flashoverlap::CollectiveImpl),
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int32_t>("world_size")
                                  .Attr<int32_t>("reduce_scatter")
                                  .Attr<int32_t>("num_groups"));
