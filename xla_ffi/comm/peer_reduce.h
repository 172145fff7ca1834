// GEMM + reduce-scatter / all-reduce over two GPUs with no SM, no copy and no stream spent on
// communication: the signaling GEMM stores the peer's share of its output straight into the
// peer's memory (NVLink stores from its epilogue), and adds the peer's share of ours as it
// stores each of our tiles (SignalingGemmArgs::add_from). Free of XLA, Python and NCCL;
// docs/DESIGN.md, "Peer stores", draws the data flow and says why.
//
// Rank r owns the rows of block r (rows_per_block = M / 2). One call, all on the compute
// stream:
//   1. wait until the peer has finished the previous call (its credit: it read its `recv`,
//      reset its counters) and, for an all-reduce, give the peer our result's address;
//   2. one GEMM launch over both row blocks, the peer's first (row rotation): the peer's
//      bands are its head groups, stored into the peer's `recv` and counted in the peer's
//      `arrived` counters (system-scope fence first); then our bands, each adding the peer's
//      partial from our `recv` once `arrived` says the peer stored it, into our rows of the
//      result; an all-reduce also stores every such tile into the peer's result (its address
//      from our mailbox);
//   3. all-reduce: tell the peer our GEMM (its mirror stores) is done, and wait until the
//      peer says the same (its rows of our result are complete);
//   4. reset our counters, then give the peer its credit for this call.
// Both ranks must run the same calls in the same order. The GEMM may hold every SM
// (comm_sms 0): nothing it waits for needs one of this GPU's SMs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/peer_reduce_args.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// One rank's state: its buffers and its peer's (peer_reduce_args.h), how it waits, and the
// calls it has enqueued (the flag values are call numbers).
struct PeerReduceRank {
  PeerReduceBuffers buffers;
  WaitMethod wait_method = WaitMethod::kStreamOp;
  // The watchdog's flag: once set, the spin-kernel waits (stream_wait.h) and the GEMM's own
  // waits for the peer's stores (SignalingGemmArgs::abort_flag) trap instead of waiting for
  // ever (the process must then restart). Stream memory-operation waits do not read it.
  const volatile int* abort_flag = nullptr;
  uint32_t calls = 0;
};

// Enqueues one call on `stream`. `gemm` describes the whole local GEMM: x [M, K] (both
// blocks), w, m = M (even), n, k, dtype, comm_sms, queue, and layout = the bands of one block
// (num_blocks 1, at most kMaxGroups / 2 bands ending at M / 2); its out, counters, row
// rotation and peer fields are set here.
// `result`: [M / 2, N] for a reduce-scatter (our block), [M, N] for an all-reduce. Nothing
// waits on the host. A failed enqueue leaves the pair unusable (the peer waits for this
// call's stores): the caller must not go on with these ranks.
Status EnqueuePeerReduce(PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                         SignalingGemmArgs gemm, void* result);

// After a failed call of this rank (enqueued in part or not at all): lets every call of the
// pair that is enqueued or will be, on either GPU, end instead of waiting for the other side
// for ever. Stream writes on `stream` set both sides' kPeerFailed word (the GEMM's waits for
// the peer then end, nothing more is mirrored) and their credit and done words past any call
// number (the stream waits pass). Those calls' results are wrong: only for a pair that makes
// no more calls (MarkPeerStoresBroken) inside a program that fails as a whole (one process:
// XLA's execution returns our error). Needs no SM on either GPU; nothing waits on the host.
Status EnqueueBreakPair(const PeerReduceRank& rank, cudaStream_t stream);

}  // namespace flashoverlap
