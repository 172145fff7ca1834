// GEMM + reduce-scatter / all-reduce over the GPUs of one group (2 to 8 ranks, kMaxPeerRanks)
// with no SM, no copy and no stream spent on communication: the signaling GEMM stores its
// partial sums of the other ranks' rows straight into a neighbour's memory (NVLink stores
// from its epilogue), adding what the other neighbour passed it on the way: a ring reduction
// inside the GEMM (SignalingGemmArgs::head_add_dests, add_from). Free of XLA, Python and NCCL;
// docs/DESIGN.md, "Peer stores" and "Ring reduction", draws the data flow and says why.
//
// Rank r owns the rows of block r (rows_per_block = M / world). Running sums go from rank r
// to rank r - 1 only, into its recv at their block's rows, counted in its `arrived` counters
// of the queue position they were computed at (peer_reduce_args.h); the other signal words
// keep what rank i tells rank j in j's slot PeerSlot(i, j). One call, all on the compute stream:
//   1. wait until every other rank has finished the previous call (its credit: it read its
//      `recv`, reset its counters) and, for an all-reduce, give every other rank our
//      result's address;
//   2. one GEMM launch over every row block, the blocks of ranks r + 1, r + 2, ... first, ours
//      last (row rotation): each other rank's bands are head groups, stored into rank r - 1's
//      `recv` and counted in its `arrived` counters (system-scope fence first), from the
//      second block on after adding what rank r + 1 stored into ours for that block; then our
//      bands, adding rank r + 1's sum of all the others' partials, into our rows of the
//      result; an all-reduce also stores every such tile into every other rank's result
//      (their addresses from our mailboxes);
//   3. all-reduce: tell the others our GEMM (its mirror stores) is done, and wait until every
//      other rank says the same (its rows of our result are complete; staged, i.e. with the
//      ranks in processes of their own: its rows of our staging area, copied into the result
//      now: the others' results are not addressable from here, PeerReduceBuffers);
//   4. reset our counters, then give the others their credit for this call.
// Every rank must run the same calls in the same order. The GEMM may hold every SM
// (comm_sms 0): nothing it waits for needs one of this GPU's SMs, because a rank's tiles at
// queue position d wait only for rank r + 1's at position d - 1, and position 0 never waits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/peer_reduce_args.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/comm/stream_write.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// One rank's state: its buffers and the other ranks' (peer_reduce_args.h), how it waits, and
// the calls it has enqueued (the flag values are call numbers).
struct PeerReduceRank {
  PeerReduceBuffers buffers;
  WaitMethod wait_method = WaitMethod::kStreamOp;
  WriteMethod write_method = WriteMethod::kStreamOp;  // the communicator's (stream_write.h)
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
// others then end, nothing more is mirrored) and their credit and done words 2^30 past this
// rank's calls, cyclically ahead of any call the others have enqueued (the stream waits pass). Those calls' results are wrong: only for a group that
// makes no more calls (MarkPeerStoresBroken) inside a program that fails as a whole (one
// process: XLA's execution returns our error). Needs no SM on any GPU; nothing waits on the
// host.
Status EnqueueBreakPeers(const PeerReduceRank& rank, cudaStream_t stream);

}  // namespace flashoverlap
