// GEMM + reduce-scatter / all-reduce over two GPUs with no SM spent on communication: the
// reduction runs in the signaling GEMM's epilogue (SignalingGemmArgs::add_from) and every
// byte moves by copy engine (cudaMemcpyAsync between the two GPUs' buffers), signalled with
// stream memory operations. Free of XLA, Python and NCCL; docs/DESIGN.md, "Copy-engine
// reduction", draws the data flow.
//
// Rank r owns the rows of block r (rows_per_block = M / 2). One call:
//   compute stream: phase 1 = x[block 1-r] @ w into `send` (our partial of the peer's block),
//                   phase 2 = x[block r] @ w + the peer's partial of block r (from `recv`, as
//                   its bands arrive) into our rows of the result;
//   comm stream:    per band g: when phase 1 has stored band g, copy it into the peer's `recv`
//                   and set the peer's arrival flag g; (all-reduce) when phase 2 has stored
//                   band g, copy it into the peer's `gather` and set its gathered flag g;
//   copy stream:    (all-reduce) per band g, once the peer's reduced band g is in `gather`,
//                   copy it to the peer block's rows of the result;
//   end:            both streams join the compute stream, which then tells the peer that
//                   `recv` and `gather` are free again (its credit).
// Flags carry call numbers (the rank's `calls`, the same sequence on both ranks), so nothing
// is reset between calls. Both ranks must run the same calls in the same order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/stream_wait.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// The flags a rank's peer writes into it (PeerReduceRank::flags), in int32 slots.
constexpr int kPeerArrivedFlags = 0;               // [kMaxGroups]: partial band g is in recv
constexpr int kPeerGatheredFlags = kMaxGroups;     // [kMaxGroups]: reduced band g is in gather
constexpr int kPeerCreditFlag = 2 * kMaxGroups;    // the peer finished reading call k's buffers
constexpr int kPeerFlagCount = 2 * kMaxGroups + 1;

enum class PeerReduceKind { kAllReduce, kReduceScatter };

// One rank's state. Buffers hold rows_per_block x N elements of the GEMM's dtype at least;
// `flags` kPeerFlagCount int32, zeroed once before the first call (then never reset);
// `counters` 2 * kMaxGroups int32 (reset by every call). The peer_* pointers are the peer's
// recv / gather / flags as this rank's streams address them (the same device, or a peer
// device with peer access enabled).
struct PeerReduceRank {
  int rank = 0;  // 0 or 1
  cudaStream_t comm_stream = nullptr;
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t call_start = nullptr, comm_done = nullptr, copy_done = nullptr;
  WaitMethod wait_method = WaitMethod::kStreamOp;
  void* send = nullptr;
  void* recv = nullptr;
  void* gather = nullptr;  // all-reduce only
  int32_t* counters = nullptr;
  int32_t* flags = nullptr;
  void* peer_recv = nullptr;
  void* peer_gather = nullptr;
  int32_t* peer_flags = nullptr;
  uint32_t calls = 0;  // calls enqueued so far
};

// Enqueues one call on `stream` (the compute stream) and the rank's own streams. `gemm`
// describes the whole local GEMM: x [M, K] (both blocks), w, m = M (even), n, k, dtype,
// comm_sms, queue, and layout = the bands of one block (num_blocks 1, band_rows summing to
// M / 2); its out, counters and add_* fields are set here. `result`: [M / 2, N] for a
// reduce-scatter (our block), [M, N] for an all-reduce. Nothing waits on the host.
Status EnqueuePeerReduce(PeerReduceRank& rank, cudaStream_t stream, PeerReduceKind kind,
                         SignalingGemmArgs gemm, void* result);

}  // namespace flashoverlap
