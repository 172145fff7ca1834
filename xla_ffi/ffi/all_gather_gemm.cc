// XLA FFI handler of the all-gather + GEMM (issue #9; the sequence-parallel column-parallel
// layer):
//
//   AllGatherGemmImpl -> FlashoverlapAllGatherGemm -> "flashoverlap_all_gather_gemm"
//
// out[n*R, N] = all_gather(x[R, K], tiled) @ w[K, N] over the n ranks of the communicator;
// an optional second result gathered[n*R, K] = all_gather(x) (ops: return_gathered=True).
// Decodes and validates, then hands the call to the framework-free sequence
// (xla_ffi/comm/all_gather_gemm_call.cc, where the chunked exchange and its flags are).
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/comm_call.h"
#include "xla_ffi/ffi/handlers.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {
namespace {

constexpr const char* kOp = "flashoverlap_all_gather_gemm";

ffi::Error ValidateAg(const Communicator* comm, ffi::AnyBuffer x, ffi::AnyBuffer w,
                      const ffi::AnyBuffer& out, const ffi::AnyBuffer* gathered,
                      int32_t world_size, int32_t comm_sms, int32_t chunks, int64_t comm_id,
                      int device, int32_t transpose_w) {
  FO_RETURN_IF_ERROR(CheckCommunicator(kOp, comm, world_size, comm_id, device));
  FO_CHECK_ARG(comm_sms >= 1 && comm->comm_sms >= 1 && comm_sms >= comm->comm_sms,
               kOp << ": comm_sms must be >= 1 and at least the communicator's CTA cap (got "
                   << comm_sms << ", communicator " << comm->comm_sms
                   << "): NCCL needs free SMs while the GEMM waits for it");
  FO_RETURN_IF_ERROR(CheckGemmOperands(kOp, x, w, out, transpose_w));
  const int64_t r = x.dimensions()[0], k = x.dimensions()[1], n = GemmN(w, transpose_w);
  auto od = out.dimensions();
  FO_CHECK_ARG(od[0] == world_size * r && od[1] == n,
               kOp << ": output must be [" << world_size * r << ", " << n << "]");
  FO_CHECK_ARG(chunks >= 1 && r % chunks == 0 &&
                   static_cast<int64_t>(world_size) * chunks <= kMaxGroups,
               kOp << ": chunks=" << chunks << " must divide the " << r
                   << " rows of x and world_size * chunks must be <= " << kMaxGroups);
  FO_CHECK_ARG(comm->peer_to_peer || chunks == 1,
               kOp << ": chunks must be 1 on a collective (all-gather) communicator, got "
                   << chunks);
  if (gathered != nullptr) {
    auto gd = gathered->dimensions();
    FO_CHECK_ARG(gathered->element_type() == x.element_type() && gd.size() == 2 &&
                     gd[0] == world_size * r && gd[1] == k,
                 kOp << ": the gathered result must be [" << world_size * r << ", " << k
                     << "] of x's dtype");
  }
  return ffi::Error::Success();  // the workspace: checked by the call, under its lock
}

ffi::Error AllGatherGemmImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                             ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int64_t comm_id,
                             int32_t world_size, int32_t comm_sms, int32_t transpose_w,
                             int32_t poison_outputs, int32_t chunks,
                             std::optional<ffi::Result<ffi::AnyBuffer>> gathered) {
  Communicator* comm = FindCommunicator(comm_id, device);
  const ffi::AnyBuffer* gathered_buffer = gathered.has_value() ? &**gathered : nullptr;
  FO_RETURN_IF_ERROR(ValidateAg(comm, x, w, *out, gathered_buffer, world_size, comm_sms, chunks,
                                comm_id, device, transpose_w));
  FO_RETURN_IF_ERROR(PoisonResults(kOp, poison_outputs, stream, {&*out, gathered_buffer}));
  // x, m, out, layout and flags are the sequence's own (the gathered workspace).
  SignalingGemmArgs gemm = GemmArgs(nullptr, 0, w, transpose_w, nullptr, nullptr, comm_sms);
  return ToFfiError(RunAllGatherGemm(*comm, stream, x.untyped_data(), x.dimensions()[0], chunks,
                                     gemm, out->untyped_data(),
                                     gathered_buffer ? gathered_buffer->untyped_data() : nullptr,
                                     /*poison_workspace=*/poison_outputs == 1, kOp));
}

// The optional result follows the attributes in the binding (results and attributes are
// decoded separately): present when the op was called with return_gathered=True.
auto BindAllGatherGemm() {
  return BindOverlapCall().Attr<int32_t>("chunks").OptionalRet<ffi::AnyBuffer>();
}

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapAllGatherGemm,
                              flashoverlap::NoThrow(flashoverlap::kOp, flashoverlap::AllGatherGemmImpl),
                              flashoverlap::BindAllGatherGemm());
