// XLA FFI handlers of GEMM + all-reduce / reduce-scatter: decode, validate, then the
// framework-free sequence (xla_ffi/comm/gemm_collective_call.cc): signaling GEMM on XLA's
// stream, one NCCL call per group on our communication stream as soon as the group's counter
// says it is complete. The all-reduce's `in_place` attribute (JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER
// =output) makes XLA's output the GEMM's and NCCL's buffer instead of the registered workspace.
// `transport` 1 (JAX_FLASHOVERLAP_TRANSPORT=peer, 2 to 8 local GPUs): peer stores instead of
// NCCL (xla_ffi/comm/peer_reduce_call.cc): the GEMM runs on every SM (comm_sms is the GEMM's,
// not the communicator's NCCL cap) and band_rows are the bands of one rank's block (M / world
// rows).
//
//   GemmAllReduceImpl      -> FlashoverlapGemmAllReduce     -> "flashoverlap_gemm_all_reduce"
//   GemmReduceScatterImpl  -> FlashoverlapGemmReduceScatter -> "flashoverlap_gemm_reduce_scatter"
#include <cuda_runtime.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/overlap_calls.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/ffi/comm_call.h"
#include "xla_ffi/ffi/handlers.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {
namespace {

using Collective = CollectiveKind;

const char* OpName(Collective kind) {
  return kind == Collective::kAllReduce ? "flashoverlap_gemm_all_reduce"
                                        : "flashoverlap_gemm_reduce_scatter";
}

// Shapes, dtypes and plan checked against what the kernel and NCCL need.
enum Transport : int32_t { kNccl = 0, kPeerStores = 1 };

ffi::Error Validate(Collective kind, const Communicator* comm, ffi::AnyBuffer x, ffi::AnyBuffer w,
                    const ffi::AnyBuffer& out, int32_t world_size,
                    ffi::Span<const int32_t> band_rows, int64_t comm_id, int device,
                    int32_t transpose_w, int32_t comm_sms, int32_t transport, bool in_place) {
  const char* op = OpName(kind);
  FO_CHECK_ARG(transport == kNccl || transport == kPeerStores,
               op << ": transport must be 0 (NCCL) or 1 (peer stores), got " << transport);
  const bool peer = transport == kPeerStores;
  FO_RETURN_IF_ERROR(CheckCommunicator(op, comm, world_size, comm_id, device));
  if (peer) {
    FO_CHECK_ARG(world_size >= 2 && world_size <= kMaxPeerRanks,
                 op << ": peer stores need 2 to " << kMaxPeerRanks << " ranks, the program has " << world_size);
    FO_CHECK_ARG(!in_place, op << ": peer stores write XLA's output directly; in_place must be 0");
  } else {
    FO_RETURN_IF_ERROR(CheckCommSms(op, comm, comm_sms));
  }
  FO_RETURN_IF_ERROR(CheckGemmOperands(op, x, w, out, transpose_w));
  const int64_t m = x.dimensions()[0], n = GemmN(w, transpose_w);
  auto od = out.dimensions();
  const int64_t blocks = kind == Collective::kReduceScatter || peer ? world_size : 1;
  FO_CHECK_ARG(m % blocks == 0, op << ": M=" << m << " not divisible by " << blocks);
  int64_t out_rows = kind == Collective::kReduceScatter ? m / world_size : m;
  FO_CHECK_ARG(od[0] == out_rows && od[1] == n,
               op << ": output must be [" << out_rows << ", " << n << "]");
  int64_t groups = static_cast<int64_t>(band_rows.size()) - 1;
  FO_CHECK_ARG(groups >= 1 && groups <= kMaxGroups,
               op << ": plan has " << groups << " groups; 1.." << kMaxGroups << " allowed");
  FO_CHECK_ARG(!peer || world_size * groups <= kMaxGroups,
               op << ": peer stores run every block's bands in one launch: at most "
                  << kMaxGroups / world_size << " bands per block, the plan has " << groups);
  FO_CHECK_ARG(band_rows[0] == 0 && band_rows[groups] == m / blocks,
               op << ": plan band_rows must run from 0 to " << m / blocks);
  for (int64_t g = 0; g < groups; ++g) {
    FO_CHECK_ARG(band_rows[g] < band_rows[g + 1], op << ": plan band_rows must increase");
  }
  return ffi::Error::Success();  // the workspace: checked by the call, under its lock
}

// in_place (all-reduce only): the GEMM writes XLA's output and NCCL reduces it there; else
// (gemm.out null) the GEMM writes the communicator's registered workspace.
ffi::Error GemmCollective(Collective kind, cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                          ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int64_t comm_id,
                          int32_t world_size, int32_t comm_sms, int32_t transpose_w,
                          int32_t poison_outputs, ffi::Span<const int32_t> band_rows,
                          bool in_place, int32_t transport) {
  Communicator* comm = FindCommunicator(comm_id, device);
  FO_RETURN_IF_ERROR(Validate(kind, comm, x, w, *out, world_size, band_rows, comm_id, device,
                              transpose_w, comm_sms, transport, in_place));
  FO_RETURN_IF_ERROR(PoisonResults(OpName(kind), poison_outputs, stream, {&*out}));
  const int groups = static_cast<int>(band_rows.size()) - 1;
  SignalingGemmArgs gemm =
      GemmArgs(x.untyped_data(), x.dimensions()[0], w, transpose_w,
               in_place ? out->untyped_data() : nullptr, /*counters=*/nullptr, comm_sms);
  // Peer stores: the bands of one block (EnqueuePeerReduce lays out both blocks).
  const bool rank_blocks = kind == Collective::kReduceScatter && transport == kNccl;
  gemm.layout.num_blocks = rank_blocks ? world_size : 1;
  gemm.layout.num_groups = groups;
  for (int g = 0; g <= groups; ++g) gemm.layout.band_rows[g] = band_rows[g];
  if (transport == kPeerStores) {
    return ToFfiError(RunGemmPeerReduce(*comm, stream, kind, gemm, out->untyped_data(), OpName(kind)));
  }
  return ToFfiError(RunGemmCollective(*comm, stream, kind, gemm, out->untyped_data(),
                                      /*poison_workspace=*/poison_outputs == 1, OpName(kind)));
}

ffi::Error GemmAllReduceImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                             ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out, int64_t comm_id,
                             int32_t world_size, int32_t comm_sms, int32_t transpose_w,
                             int32_t poison_outputs, ffi::Span<const int32_t> band_rows,
                             int32_t transport, int32_t in_place) {
  FO_CHECK_ARG(in_place == 0 || in_place == 1,
               "flashoverlap_gemm_all_reduce: in_place must be 0 or 1, got " << in_place);
  return GemmCollective(Collective::kAllReduce, stream, device, x, w, out, comm_id, world_size,
                        comm_sms, transpose_w, poison_outputs, band_rows, in_place == 1,
                        transport);
}

ffi::Error GemmReduceScatterImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                                 ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                                 int64_t comm_id, int32_t world_size, int32_t comm_sms,
                                 int32_t transpose_w, int32_t poison_outputs,
                                 ffi::Span<const int32_t> band_rows, int32_t transport) {
  return GemmCollective(Collective::kReduceScatter, stream, device, x, w, out, comm_id,
                        world_size, comm_sms, transpose_w, poison_outputs, band_rows,
                        /*in_place=*/false, transport);
}

auto BindCollective() {
  return BindOverlapCall().Attr<ffi::Span<const int32_t>>("band_rows").Attr<int32_t>("transport");
}

}  // namespace
}  // namespace flashoverlap

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapGemmAllReduce,
                              flashoverlap::NoThrow("flashoverlap_gemm_all_reduce",
                                                    flashoverlap::GemmAllReduceImpl),
                              flashoverlap::BindCollective().Attr<int32_t>("in_place"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashoverlapGemmReduceScatter,
                              flashoverlap::NoThrow("flashoverlap_gemm_reduce_scatter",
                                                    flashoverlap::GemmReduceScatterImpl),
                              flashoverlap::BindCollective());
