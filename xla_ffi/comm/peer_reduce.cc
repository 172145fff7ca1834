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
  const int bands = gemm.layout.num_groups;

  // 1. The peer has finished the previous call: its recv is free, its counters are zero.
  FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(stream, r.signals + kPeerCredit, call - 1, wait, abort_flag));
  if (all_reduce) FO_RETURN_IF_NOT_OK(PostResultAddress(r, stream, result, call));
  // 2. One launch over both blocks, the peer's first (peer_reduce_args.h).
  SignalingGemmArgs fused = PeerReduceLaunchArgs(r, kind, gemm, result, call);
  fused.abort_flag = abort_flag;  // the GEMM's waits for the peer's stores give up too
  FO_RETURN_IF_NOT_OK(GemmLaunchStatus(LaunchSignalingGemm(fused, stream), "signaling GEMM launch"));
  // 3. All-reduce: the peer's block of our result is complete.
  if (all_reduce) {
    for (int g = 0; g < bands; ++g) {
      FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(stream, r.signals + kPeerGathered + g,
                                         static_cast<int32_t>(TilesInGroup(fused, bands + g)), wait,
                                         abort_flag));
    }
  }
  // 4. Our recv is read and our counters complete: reset them, then the peer may go on.
  FO_RETURN_IF_CUDA(cudaMemsetAsync(r.signals, 0, sizeof(int32_t) * kPeerCredit, stream));
  return EnqueueWriteFlag(stream, r.peer_signals + kPeerCredit, call);
}

// What EnqueueReleasePeer writes into a counter the peer waits on with ">=": more than any
// group's tile count, far from overflowing if our real stores (a launch that did run) add to it.
constexpr int32_t kReleasedCount = 1 << 24;

}  // namespace

Status EnqueueReleasePeer(const PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                          int64_t rows_per_block, int64_t n, int32_t call) {
  const PeerReduceBuffers& r = rank.buffers;
  if (r.signals == nullptr || r.peer_signals == nullptr) return Status::Ok();  // no pair: nothing waits
  // The peer's previous call is over: nothing of it reads what we write now.
  FO_RETURN_IF_NOT_OK(EnqueueWaitGeq(stream, r.signals + kPeerCredit, call - 1, rank.wait_method,
                                     rank.abort_flag));
  const bool all_reduce = kind == PeerReduceKind::kAllReduce;
  if (all_reduce && r.recv != nullptr) {
    const size_t peer_rows_at = static_cast<size_t>(1 - r.rank) * rows_per_block * n * 2;
    FO_RETURN_IF_NOT_OK(PostResultAddress(r, stream, PeerRowsBase(r.recv, peer_rows_at), call));
  }
  for (int g = 0; g < kMaxGroups; ++g) {
    FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, r.peer_signals + kPeerArrived + g, kReleasedCount));
    if (all_reduce) {
      FO_RETURN_IF_NOT_OK(EnqueueWriteFlag(stream, r.peer_signals + kPeerGathered + g, kReleasedCount));
    }
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
