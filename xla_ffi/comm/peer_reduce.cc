// GEMM + reduce-scatter / all-reduce over the GPUs of a group by peer stores (peer_reduce.h has the
// sequence; docs/DESIGN.md the reasons).
#include "xla_ffi/comm/peer_reduce.h"

#include <string>

#include "xla_ffi/comm/gemm_status.h"
#include "xla_ffi/comm/stream_batch.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/comm/stream_write.h"

namespace flashoverlap {
namespace {

Status CheckArgs(const PeerReduceBuffers& r, const SignalingGemmArgs& gemm, const void* result) {
  if (r.world < 2 || r.world > kMaxPeerRanks)
    return Status::Error("world must be in [2, " + std::to_string(kMaxPeerRanks) + "], got " + std::to_string(r.world));
  if (r.rank < 0 || r.rank >= r.world) return Status::Error("rank must be in [0, world)");
  if (gemm.m < r.world || gemm.m % r.world != 0)
    return Status::Error("M must be a multiple of the world size (one row block per rank)");
  const GroupLayout& layout = gemm.layout;
  if (layout.num_blocks != 1) return Status::Error("layout must be the bands of one block (num_blocks 1)");
  if (layout.num_groups < 1 || r.world * layout.num_groups > kMaxGroups)
    return Status::Error("layout.num_groups must be in [1, kMaxGroups / world] (every block's bands are groups of one launch)");
  if (layout.band_rows[layout.num_groups] != gemm.m / r.world)
    return Status::Error("the bands must cover one block: band_rows[num_groups] = M / world");
  if (gemm.row_rotation != 0 || gemm.out_col_block != 0 || gemm.in_flags != nullptr ||
      gemm.add_from != nullptr || gemm.mirror_count != 0 || gemm.head_groups != 0 || gemm.helpers)
    return Status::Error("row_rotation / out_col_block / in_flags / add_from / mirror_slots / head_groups / "
                         "helpers are set here or unsupported");
  if (gemm.m > (int64_t(1) << 30)) return Status::Error("M must be < 2^30");
  if (result == nullptr || r.recv == nullptr || r.signals == nullptr)
    return Status::Error("result, recv and signals must be set");
  for (int i = 0; i < r.world; ++i) {
    if (i != r.rank && (r.peers_recv[i] == nullptr || r.peers_signals[i] == nullptr))
      return Status::Error("peers_recv and peers_signals must be set for rank " + std::to_string(i));
  }
  if ((reinterpret_cast<uintptr_t>(r.signals + kPeerMailbox) & 7) != 0)
    return Status::Error("signals must be 8-byte aligned (the mailboxes hold pointers)");
  return Status::Ok();
}

// Rank `to`'s word `word` of the slot that holds what rank `from` tells it.
int32_t* SlotWord(const PeerReduceBuffers& r, int word, int from, int to) {
  return r.peers_signals[to] + word + PeerSlot(from, to, r.world);
}

// How a rank waits for and writes its words (chosen when its communicator was made).
struct WordMethods {
  WaitMethod wait;
  WriteMethod write;
};

// The word operations of one step (waits for, or writes into, every other rank's word),
// enqueued as one stream operation (stream_batch.h) where the waits are stream operations
// (its writes too: the write method is then the stream operation as well, as both follow
// JAX_FLASHOVERLAP_WAIT), else one at a time (spin kernels, which the watchdog's abort flag
// reaches, and writes by the write method).
class StepOps {
 public:
  void Wait(int32_t* word, int32_t value) { Add(StreamWordOp{StreamWordOp::kWaitGeq, word, value}); }
  void Write(int32_t* word, int32_t value) { Add(StreamWordOp{StreamWordOp::kWrite, word, value}); }
  Status Enqueue(cudaStream_t stream, const WordMethods& how, const volatile int* abort_flag) const {
    if (how.wait == WaitMethod::kStreamOp && HaveStreamBatch()) return EnqueueStreamBatch(stream, ops_, count_);
    for (int i = 0; i < count_; ++i) {
      const StreamWordOp& op = ops_[i];
      FO_RETURN_IF_NOT_OK(op.kind == StreamWordOp::kWaitGeq
                              ? EnqueueWaitGeq(stream, op.word, op.value, how.wait, abort_flag)
                              : EnqueueWriteFlag(stream, op.word, op.value, how.write));
    }
    return Status::Ok();
  }

 private:
  static constexpr int kCapacity = 2 * (kMaxPeerRanks - 1);  // two words per other rank at most
  static_assert(kCapacity <= kMaxStreamBatch, "a step's operations fit one batch");
  void Add(const StreamWordOp& op) { ops_[count_++] = op; }  // callers add at most kCapacity
  StreamWordOp ops_[kCapacity] = {};
  int count_ = 0;
};

// The mirror addresses of an all-reduce, then, as a second step, the call's stamps: each
// stream write is preceded by a memory barrier, so a kernel that reads this call's stamp
// (acquire) reads this call's address. In one process: each other rank's mailbox (our slot
// there) <- our result's address. Staged (the others' results are in other processes): our
// own mailbox slot for each other rank <- where our block goes in its staging area, as this
// process maps it; the kernel reads both alike.
Status PostMirrorAddresses(const PeerReduceBuffers& r, const WordMethods& how, cudaStream_t stream, const void* result,
                           size_t block_bytes, int32_t call) {
  StepOps addresses, stamps;
  for (int to = 0; to < r.world; ++to) {
    if (to == r.rank) continue;
    const bool staged = r.mirror_staged;
    const void* target = staged ? PeerStagedMirrorBase(r.peers_recv[to], r.rank, to, r.world, block_bytes) : result;
    int32_t* mailbox = (staged ? r.signals : r.peers_signals[to]) + kPeerMailbox +
                       kPeerMailboxWords * (staged ? PeerSlot(to, r.rank, r.world) : PeerSlot(r.rank, to, r.world));
    const uint64_t address = reinterpret_cast<uintptr_t>(target);
    addresses.Write(mailbox, static_cast<int32_t>(address & 0xffffffffu));
    addresses.Write(mailbox + 1, static_cast<int32_t>(address >> 32));
    stamps.Write(mailbox + 2, call);
  }
  FO_RETURN_IF_NOT_OK(addresses.Enqueue(stream, how, nullptr));
  return stamps.Enqueue(stream, how, nullptr);
}

// Staged, once every other rank's mirror stores are complete: the other blocks from our
// staging area (rank order, ours skipped) into the result, around our own block.
Status CopyStagedBlocks(const PeerReduceBuffers& r, cudaStream_t stream, size_t block_bytes, char* result) {
  const char* staging = static_cast<const char*>(r.recv) + PeerStageOffset(r.world, block_bytes);
  PeerStagedCopy copies[2];
  const int count = PeerStagedCopies(r.rank, r.world, block_bytes, copies);
  for (int i = 0; i < count; ++i) {
    FO_RETURN_IF_CUDA(cudaMemcpyAsync(result + copies[i].to, staging + copies[i].from, copies[i].bytes,
                                      cudaMemcpyDeviceToDevice, stream));
  }
  return Status::Ok();
}

// Waits until every other rank's word `word` (our slot for it) reaches `value`.
Status WaitForPeers(const PeerReduceBuffers& r, const WordMethods& how, const volatile int* abort_flag,
                    cudaStream_t stream, int word, int32_t value) {
  StepOps ops;
  for (int s = 0; s < r.world - 1; ++s) ops.Wait(r.signals + word + s, value);
  return ops.Enqueue(stream, how, abort_flag);
}

// Writes `value` into our slot of word `word` of every other rank.
Status TellPeers(const PeerReduceBuffers& r, const WordMethods& how, cudaStream_t stream, int word, int32_t value) {
  StepOps ops;
  for (int to = 0; to < r.world; ++to)
    if (to != r.rank) ops.Write(SlotWord(r, word, r.rank, to), value);
  return ops.Enqueue(stream, how, nullptr);
}

// Call numbers wrap (uint32 counts, compared cyclically: stream_wait.h); no signed overflow.
int32_t CallBefore(int32_t call) {
  return static_cast<int32_t>(static_cast<uint32_t>(call) - 1u);
}

Status EnqueueCall(const PeerReduceBuffers& r, const WordMethods& how, const volatile int* abort_flag,
                   cudaStream_t stream, PeerReduceKind kind, const SignalingGemmArgs& gemm,
                   char* result, int32_t call) {
  const bool all_reduce = kind == PeerReduceKind::kAllReduce;
  const size_t block_bytes = static_cast<size_t>(gemm.m / r.world) * gemm.n * 2;

  // 1. Every other rank has finished the previous call: our slot of its recv is free (and,
  // staged, its staging area copied out), its counters are zero.
  FO_RETURN_IF_NOT_OK(WaitForPeers(r, how, abort_flag, stream, kPeerCredit, CallBefore(call)));
  if (all_reduce) FO_RETURN_IF_NOT_OK(PostMirrorAddresses(r, how, stream, result, block_bytes, call));
  // 2. One launch over every block, ours last (peer_reduce_args.h).
  SignalingGemmArgs fused = PeerReduceLaunchArgs(r, kind, gemm, result, call);
  fused.abort_flag = abort_flag;  // the GEMM's waits for the others' stores give up too
  FO_RETURN_IF_NOT_OK(GemmLaunchStatus(LaunchSignalingGemm(fused, stream), "signaling GEMM launch"));
  // 3. All-reduce: our mirror stores into the others' results are complete (the stream
  // write's memory barrier orders them before it), and theirs into ours.
  // Staged: theirs are in our staging area, copied into the result now.
  if (all_reduce) {
    FO_RETURN_IF_NOT_OK(TellPeers(r, how, stream, kPeerDone, call));
    FO_RETURN_IF_NOT_OK(WaitForPeers(r, how, abort_flag, stream, kPeerDone, call));
    if (r.mirror_staged) FO_RETURN_IF_NOT_OK(CopyStagedBlocks(r, stream, block_bytes, result));
  }
  // 4. Our recv is read and our counters complete: reset them, then the others may go on.
  FO_RETURN_IF_CUDA(cudaMemsetAsync(r.signals + kPeerArrived, 0, sizeof(int32_t) * kPeerArrivedWords, stream));
  return TellPeers(r, how, stream, kPeerCredit, call);
}

// How far past this rank's last call EnqueueBreakPeers puts the call-number words every rank
// waits on with a cyclic ">=": ahead of any call the others have enqueued (ranks are at most
// a few calls apart), wherever the numbers are. A fixed 2^30 stopped releasing them once the
// calls passed 2^30 (a hang instead of the break's error).
constexpr uint32_t kBrokenCallsAhead = 1u << 30;

}  // namespace

Status EnqueueBreakPeers(const PeerReduceRank& rank, cudaStream_t stream) {
  const PeerReduceBuffers& r = rank.buffers;
  const int32_t broken = static_cast<int32_t>(rank.calls + kBrokenCallsAhead);
  // Every word is tried whatever an earlier write said (the first failure is returned): a
  // rank whose words were left out would wait for ever.
  Status first = Status::Ok();
  auto write = [&first, &rank, stream](int32_t* word, int32_t value) {
    Status s = EnqueueWriteFlag(stream, word, value, rank.write_method);
    if (first.ok() && !s.ok()) first = s;
  };
  for (int i = 0; i < r.world; ++i) {
    int32_t* signals = i == r.rank ? r.signals : r.peers_signals[i];
    if (signals == nullptr) continue;  // no group set up: nothing waits
    write(signals + kPeerFailed, 1);
    for (int s = 0; s < r.world - 1; ++s) {
      write(signals + kPeerCredit + s, broken);
      write(signals + kPeerDone + s, broken);
    }
  }
  return first;
}

Status EnqueuePeerReduce(PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                         SignalingGemmArgs gemm, void* result) {
  FO_RETURN_IF_NOT_OK(CheckArgs(rank.buffers, gemm, result));
  const int32_t call = static_cast<int32_t>(++rank.calls);
  Status status = EnqueueCall(rank.buffers, {rank.wait_method, rank.write_method}, rank.abort_flag, stream, kind, gemm,
                              static_cast<char*>(result), call);
  if (!status.ok()) {
    status.message = "peer reduce (rank " + std::to_string(rank.buffers.rank) + "): " + status.message;
  }
  return status;
}

}  // namespace flashoverlap
