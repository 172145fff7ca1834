// GEMM + reduce-scatter / all-reduce over two GPUs, reduction in the GEMM's epilogue,
// transport by copy engine (peer_reduce.h has the sequence; docs/DESIGN.md the reasons).
#include "xla_ffi/comm/peer_reduce.h"

#include <string>

#include "xla_ffi/comm/gemm_status.h"
#include "xla_ffi/comm/stream_write.h"

namespace flashoverlap {
namespace {

struct Band {
  int64_t first_row, rows;
};

// A copy on the copy engines. The GEMM's CTAs hold every register of their SMs, and phase 2
// waits for these copies: a copy the driver ran as a kernel (as it may run device-to-device
// copies) would find no SM and never start. cudaMemcpyBatchAsync's overlap-with-compute flag
// asks for the copy engines (a hint: tests/cuda/copy_engine_probe checks it is honoured).
cudaError_t EngineCopy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr = {};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
  void* dsts[1] = {dst};
  const void* srcs[1] = {src};
  size_t sizes[1] = {bytes};
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, &attr_index, 1, stream);
#else
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
#endif
}

Band BandOf(const GroupLayout& layout, int g) {
  return {layout.band_rows[g], layout.band_rows[g + 1] - layout.band_rows[g]};
}

Status CheckArgs(const PeerReduceRank& r, PeerReduceKind kind, const SignalingGemmArgs& gemm,
                 const void* result) {
  if (r.rank != 0 && r.rank != 1) return Status::Error("rank must be 0 or 1");
  if (gemm.m < 2 || gemm.m % 2 != 0) return Status::Error("M must be even (two row blocks)");
  if (gemm.layout.num_blocks != 1) return Status::Error("layout must be the bands of one block (num_blocks 1)");
  if (gemm.layout.num_groups < 1 || gemm.layout.num_groups > kMaxGroups)
    return Status::Error("layout.num_groups must be in [1, kMaxGroups]");
  if (gemm.layout.band_rows[gemm.layout.num_groups] != gemm.m / 2)
    return Status::Error("the bands must cover one block: band_rows[num_groups] = M / 2");
  if (gemm.row_rotation != 0 || gemm.out_col_block != 0 || gemm.in_flags != nullptr ||
      gemm.add_from != nullptr || gemm.helpers)
    return Status::Error("row_rotation / out_col_block / in_flags / add_from / helpers are set here or unsupported");
  if (result == nullptr || r.send == nullptr || r.recv == nullptr || r.counters == nullptr ||
      r.flags == nullptr || r.peer_recv == nullptr || r.peer_flags == nullptr)
    return Status::Error("result, send, recv, counters, flags, peer_recv and peer_flags must be set");
  if (kind == PeerReduceKind::kAllReduce && (r.gather == nullptr || r.peer_gather == nullptr))
    return Status::Error("an all-reduce needs gather and peer_gather");
  if (r.comm_stream == nullptr || r.copy_stream == nullptr || r.call_start == nullptr ||
      r.comm_done == nullptr || r.copy_done == nullptr)
    return Status::Error("the rank's streams and events must be created");
  return Status::Ok();
}

// Per band: wait until `counters` says the GEMM stored it, copy it to the peer's buffer, then
// raise the peer's flag for it (the copy is complete, and visible, before the flag is).
Status SendBands(PeerReduceRank& r, const SignalingGemmArgs& phase, const char* from,
                 char* peer_to, int flag_base, int32_t call) {
  const size_t row_bytes = static_cast<size_t>(phase.n) * 2;
  for (int g = 0; g < phase.layout.num_groups; ++g) {
    const Band b = BandOf(phase.layout, g);
    FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(r.comm_stream, phase.counters + g,
                                       static_cast<int32_t>(TilesInGroup(phase, g)), r.wait_method));
    FO_RETURN_IF_CUDA(EngineCopy(peer_to + b.first_row * row_bytes, from + b.first_row * row_bytes,
                                 b.rows * row_bytes, r.comm_stream));
    FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(r.comm_stream, r.peer_flags + flag_base + g, call));
  }
  return Status::Ok();
}

// All-reduce: per band, once the peer's reduced band is in `gather`, copy it to its rows.
Status ReceiveGatheredBands(PeerReduceRank& r, const SignalingGemmArgs& phase, char* to,
                            int32_t call) {
  const size_t row_bytes = static_cast<size_t>(phase.n) * 2;
  const char* gather = static_cast<const char*>(r.gather);
  for (int g = 0; g < phase.layout.num_groups; ++g) {
    const Band b = BandOf(phase.layout, g);
    FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(r.copy_stream, r.flags + kPeerGatheredFlags + g, call,
                                       r.wait_method));
    FO_RETURN_IF_CUDA(EngineCopy(to + b.first_row * row_bytes, gather + b.first_row * row_bytes,
                                 b.rows * row_bytes, r.copy_stream));
  }
  return Status::Ok();
}

Status EnqueueCall(PeerReduceRank& r, cudaStream_t stream, PeerReduceKind kind,
                   const SignalingGemmArgs& gemm, char* result, int32_t call, bool* joined) {
  const bool all_reduce = kind == PeerReduceKind::kAllReduce;
  const int64_t rows = gemm.m / 2;
  const size_t row_bytes = static_cast<size_t>(gemm.n) * 2;
  const size_t x_block_bytes = static_cast<size_t>(rows) * gemm.k * 2;
  const char* x = static_cast<const char*>(gemm.x);
  const int peer = 1 - r.rank;

  FO_RETURN_IF_CUDA(cudaMemsetAsync(r.counters, 0, sizeof(int32_t) * 2 * kMaxGroups, stream));
  FO_RETURN_IF_CUDA(cudaEventRecord(r.call_start, stream));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(r.comm_stream, r.call_start, 0));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(r.copy_stream, r.call_start, 0));

  // Phase 1: our partial of the peer's block.
  SignalingGemmArgs phase1 = gemm;
  phase1.x = x + peer * x_block_bytes;
  phase1.m = rows;
  phase1.out = r.send;
  phase1.counters = r.counters;
  FO_RETURN_IF_NOT_OK(GemmLaunchStatus(LaunchSignalingGemm(phase1, stream), "phase-1 GEMM launch"));
  // Phase 2: our block, plus the peer's partial of it as its bands arrive.
  SignalingGemmArgs phase2 = phase1;
  phase2.x = x + r.rank * x_block_bytes;
  phase2.out = all_reduce ? result + r.rank * rows * row_bytes : result;
  phase2.counters = r.counters + kMaxGroups;
  phase2.add_from = r.recv;
  phase2.add_sources = 1;
  phase2.add_flags = r.flags + kPeerArrivedFlags;
  phase2.add_flag_value = call;
  FO_RETURN_IF_NOT_OK(GemmLaunchStatus(LaunchSignalingGemm(phase2, stream), "phase-2 GEMM launch"));

  // The peer's recv / gather hold our previous call's data until it says it has read them.
  FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(r.comm_stream, r.flags + kPeerCreditFlag, call - 1, r.wait_method));
  FO_RETURN_IF_NOT_OK(SendBands(r, phase1, static_cast<const char*>(r.send),
                                static_cast<char*>(r.peer_recv), kPeerArrivedFlags, call));
  if (all_reduce) {
    FO_RETURN_IF_NOT_OK(SendBands(r, phase2, static_cast<const char*>(phase2.out),
                                  static_cast<char*>(r.peer_gather), kPeerGatheredFlags, call));
    FO_RETURN_IF_NOT_OK(ReceiveGatheredBands(r, phase2, result + peer * rows * row_bytes, call));
  }
  // Join: the next call's phase 1 overwrites `send`, which our copies read.
  *joined = true;
  FO_RETURN_IF_CUDA(cudaEventRecord(r.comm_done, r.comm_stream));
  FO_RETURN_IF_CUDA(cudaEventRecord(r.copy_done, r.copy_stream));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(stream, r.comm_done, 0));
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(stream, r.copy_done, 0));
  // Phase 2 has read `recv`, the copy stream `gather`: the peer may fill them again.
  return EnqueueWriteFlag(stream, r.peer_flags + kPeerCreditFlag, call);
}

}  // namespace

Status EnqueuePeerReduce(PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                         SignalingGemmArgs gemm, void* result) {
  FO_RETURN_IF_NOT_OK(CheckArgs(rank, kind, gemm, result));
  const int32_t call = static_cast<int32_t>(++rank.calls);
  bool joined = false;
  Status status = EnqueueCall(rank, stream, kind, gemm, static_cast<char*>(result), call, &joined);
  if (!status.ok() && !joined) {
    // Never leave our streams running past the call unjoined (best effort after an error).
    cudaEventRecord(rank.comm_done, rank.comm_stream);
    cudaEventRecord(rank.copy_done, rank.copy_stream);
    cudaStreamWaitEvent(stream, rank.comm_done, 0);
    cudaStreamWaitEvent(stream, rank.copy_done, 0);
  }
  if (!status.ok()) status.message = "peer reduce (rank " + std::to_string(rank.rank) + "): " + status.message;
  return status;
}

}  // namespace flashoverlap
