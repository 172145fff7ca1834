// GEMM + reduce-scatter / all-reduce over the GPUs of one group (2 to 8 ranks, kMaxPeerRanks)
// with no SM, no copy and no stream spent on communication: the signaling GEMM stores each
// other rank's share of its output straight into that rank's memory (NVLink stores from its
// epilogue), and adds the others' shares of ours as it stores each of our tiles
// (SignalingGemmArgs::add_from). Free of XLA, Python and NCCL; docs/DESIGN.md, "Peer
// stores", draws the data flow and says why.
//
// Rank r owns the rows of block r (rows_per_block = M / world). What rank i sends rank j
// lands in j's slot PeerSlot(i, j) (peer_reduce_args.h) of its recv buffer and signal words.
// One call, all on the compute stream:
//   1. wait until every other rank has finished the previous call (its credit: it read its
//      `recv`, reset its counters) and, for an all-reduce, give every other rank our
//      result's address;
//   2. one GEMM launch over every row block, the blocks of ranks r + 1, r + 2, ... first, ours
//      last (row rotation): each other rank's bands are head groups, stored into that rank's
//      `recv` and counted in its `arrived` counters (system-scope fence first); then our
//      bands, each adding the others' partials from our `recv` once `arrived` says they
//      stored them, into our rows of the result; an all-reduce also stores every such tile
//      into every other rank's result (their addresses from our mailboxes);
//   3. all-reduce: tell the others our GEMM (its mirror stores) is done, and wait until every
//      other rank says the same (its rows of our result are complete);
//   4. reset our counters, then give the others their credit for this call.
// Every rank must run the same calls in the same order. The GEMM may hold every SM
// (comm_sms 0): nothing it waits for needs one of this GPU's SMs, because each rank's head
// tiles never wait (the queue order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/peer_reduce_args.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// One rank's state: its buffers and the other ranks' (peer_reduce_args.h), how it waits, and
// the calls it has enqueued (the flag values are call numbers).
struct PeerReduceRank {
  PeerReduceBuffers buffers;
  WaitMethod wait_method = WaitMethod::kStreamOp;
  // The watchdog's flag: once set, the spin-kernel waits (stream_wait.h) and the GEMM's own
  // waits for the others' stores (SignalingGemmArgs::abort_flag) trap instead of waiting for
  // ever (the process must then restart). Stream memory-operation waits do not read it.
  const volatile int* abort_flag = nullptr;
  uint32_t calls = 0;
};

// Enqueues one call on `stream`. `gemm` describes the whole local GEMM: x [M, K] (every
// block), w, m = M (a multiple of the world size), n, k, dtype, comm_sms, queue, and layout =
// the bands of one block (num_blocks 1, at most kMaxGroups / world bands ending at
// M / world); its out, counters, row rotation and peer fields are set here.
// `result`: [M / world, N] for a reduce-scatter (our block), [M, N] for an all-reduce.
// Nothing waits on the host. A failed enqueue leaves the group unusable (the others wait
// for this call's stores): the caller must not go on with these ranks (EnqueueBreakPeers).
Status EnqueuePeerReduce(PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                         SignalingGemmArgs gemm, void* result);

// After a failed call of this rank (enqueued in part or not at all): lets every call of the
// group that is enqueued or will be, on any GPU, end instead of waiting for the others for
// ever. Stream writes on `stream` set every rank's kPeerFailed word (the GEMM's waits for the
// others then end, nothing more is mirrored) and their credit and done words past any call
// number (the stream waits pass). Those calls' results are wrong: only for a group that
// makes no more calls (MarkPeerStoresBroken) inside a program that fails as a whole (one
// process: XLA's execution returns our error). Needs no SM on any GPU; nothing waits on the
// host.
Status EnqueueBreakPeers(const PeerReduceRank& rank, cudaStream_t stream);

}  // namespace flashoverlap
