// GEMM + reduce-scatter / all-reduce over two GPUs by peer stores (peer_reduce.h has the
// sequence; docs/DESIGN.md the reasons).
#include "xla_ffi/comm/peer_reduce.h"

#include <string>

#include "xla_ffi/comm/gemm_status.h"
#include "xla_ffi/comm/stream_write.h"

namespace flashoverlap {
namespace {

Status CheckArgs(const PeerReduceBuffers& r, const SignalingGemmArgs& gemm, const void* result) {
  if (r.rank != 0 && r.rank != 1) return Status::Error("rank must be 0 or 1");
  if (gemm.m < 2 || gemm.m % 2 != 0) return Status::Error("M must be even (two row blocks)");
  const GroupLayout& layout = gemm.layout;
  if (layout.num_blocks != 1) return Status::Error("layout must be the bands of one block (num_blocks 1)");
  if (layout.num_groups < 1 || 2 * layout.num_groups > kMaxGroups)
    return Status::Error("layout.num_groups must be in [1, kMaxGroups / 2] (both blocks' bands are groups of one launch)");
  if (layout.band_rows[layout.num_groups] != gemm.m / 2)
    return Status::Error("the bands must cover one block: band_rows[num_groups] = M / 2");
  if (gemm.row_rotation != 0 || gemm.out_col_block != 0 || gemm.in_flags != nullptr ||
      gemm.add_from != nullptr || gemm.mirror_slot != nullptr || gemm.head_groups != 0 || gemm.helpers)
    return Status::Error("row_rotation / out_col_block / in_flags / add_from / mirror_slot / head_groups / "
                         "helpers are set here or unsupported");
  if (gemm.m > (int64_t(1) << 30)) return Status::Error("M must be < 2^30");
  if (result == nullptr || r.recv == nullptr || r.signals == nullptr || r.peer_recv == nullptr ||
      r.peer_signals == nullptr)
    return Status::Error("result, recv, signals, peer_recv and peer_signals must be set");
  if ((reinterpret_cast<uintptr_t>(r.signals + kPeerMailbox) & 7) != 0)
    return Status::Error("signals must be 8-byte aligned (the mailbox holds a pointer)");
  return Status::Ok();
}

// The peer's mailbox <- our result's address (two words), then the call's stamp: each
// stream write is preceded by a memory barrier, so a kernel that reads this call's stamp
// (acquire) reads this call's address.
Status PostResultAddress(const PeerReduceBuffers& r, cudaStream_t stream, const void* result, int32_t call) {
  const uint64_t address = reinterpret_cast<uintptr_t>(result);
  int32_t* mailbox = r.peer_signals + kPeerMailbox;
  FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, mailbox, static_cast<int32_t>(address & 0xffffffffu)));
  FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, mailbox + 1, static_cast<int32_t>(address >> 32)));
  return EnqueueWriteFlag(stream, mailbox + 2, call);
}

Status EnqueueCall(const PeerReduceBuffers& r, WaitMethod wait, const volatile int* abort_flag,
                   cudaStream_t stream, PeerReduceKind kind, const SignalingGemmArgs& gemm,
                   char* result, int32_t call) {
  const bool all_reduce = kind == PeerReduceKind::kAllReduce;

  // 1. The peer has finished the previous call: its recv is free, its counters are zero.
  FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(stream, r.signals + kPeerCredit, call - 1, wait, abort_flag));
  if (all_reduce) FO_RETURN_IF_NOT_OK(PostResultAddress(r, stream, result, call));
  // 2. One launch over both blocks, the peer's first (peer_reduce_args.h).
  SignalingGemmArgs fused = PeerReduceLaunchArgs(r, kind, gemm, result, call);
  fused.abort_flag = abort_flag;  // the GEMM's waits for the peer's stores give up too
  FO_RETURN_IF_NOT_OK(GemmLaunchStatus(LaunchSignalingGemm(fused, stream), "signaling GEMM launch"));
  // 3. All-reduce: our mirror stores into the peer's result are complete (the stream write's
  // memory barrier orders them before it), and the peer's into ours.
  if (all_reduce) {
    FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, r.peer_signals + kPeerDone, call));
    FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(stream, r.signals + kPeerDone, call, wait, abort_flag));
  }
  // 4. Our recv is read and our counters complete: reset them, then the peer may go on.
  FO_RETURN_IF_CUDA(cudaMemsetAsync(r.signals + kPeerArrived, 0, sizeof(int32_t) * kMaxGroups, stream));
  return EnqueueWriteFlag(stream, r.peer_signals + kPeerCredit, call);
}

// What EnqueueBreakPair writes into the call-number words both sides wait on with ">=":
// past any call either side will make.
constexpr int32_t kBrokenCallNumber = 1 << 30;

}  // namespace

Status EnqueueBreakPair(const PeerReduceRank& rank, cudaStream_t stream) {
  const PeerReduceBuffers& r = rank.buffers;
  for (int32_t* signals : {r.signals, r.peer_signals}) {
    if (signals == nullptr) continue;  // no pair set up: nothing waits
    FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, signals + kPeerFailed, 1));
    FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, signals + kPeerCredit, kBrokenCallNumber));
    FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, signals + kPeerDone, kBrokenCallNumber));
  }
  return Status::Ok();
}

Status EnqueuePeerReduce(PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                         SignalingGemmArgs gemm, void* result) {
  FO_RETURN_IF_NOT_OK(CheckArgs(rank.buffers, gemm, result));
  const int32_t call = static_cast<int32_t>(++rank.calls);
  Status status = EnqueueCall(rank.buffers, rank.wait_method, rank.abort_flag, stream, kind, gemm,
                              static_cast<char*>(result), call);
  if (!status.ok()) {
    status.message = "peer reduce (rank " + std::to_string(rank.buffers.rank) + "): " + status.message;
  }
  return status;
}

}  // namespace flashoverlap
