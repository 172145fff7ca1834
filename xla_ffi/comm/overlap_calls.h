// The overlapped ops' enqueue sequences, free of XLA and Python: what an FFI handler runs
// once it has decoded and validated its buffers, and what tests/cuda/overlap_harness.cc runs
// without JAX (so compute-sanitizer can watch one overlapped call whole).
//
// Contract of every Run* function: `comm` is this device's communicator, `stream` the
// compute stream the call is ordered on (XLA's), the shapes were validated by the caller.
// Each one takes the communicator's call mutex, fails at once if the watchdog aborted it,
// takes the workspace under that mutex (UseWorkspace: checked to hold what the op needs, NaN
// first with poison_workspace), enqueues the whole call (nothing waits on the host), and
// joins our streams back to `stream` even after an error. A failed Status names `op`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

enum class CollectiveKind { kAllReduce, kReduceScatter };

// GEMM + all-reduce / reduce-scatter (gemm_collective_call.cc). With gemm.out null, `gemm`
// writes into comm.workspace in the group layout (num_blocks = world size for a
// reduce-scatter). It signals comm.counters: the call sets gemm.counters under the
// communicator's call mutex (whatever the caller gave; a destroy on another thread clears
// them, and BeginCall then refuses the call); `result` is [M, N] (all-reduce) or
// [M / world, N] (reduce-scatter). An all-reduce whose gemm.out is `result` runs in place
// there (no workspace, no copies).
Status RunGemmCollective(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         SignalingGemmArgs gemm, void* result, bool poison_workspace,
                         const char* op);

// GEMM + all-reduce / reduce-scatter over the local GPUs of a group (2 to 8) by peer stores
// (peer_reduce_call.cc; peer_reduce.h draws the sequence): no NCCL call, no workspace. `gemm`
// is the whole local GEMM, layout = the bands of one row block (num_blocks 1, ending at
// M / world); `result` [M, N] (all-reduce) or [M / world, N]. Needs the communicator's peer
// stores (EnsurePeerStores) holding PeerRecvBlocks(world) blocks of M / world x N elements
// (peer_reduce_args.h; plus the staging blocks of a staged all-reduce). A failure lets
// every call of the group end (EnqueueBreakPeers: the others', enqueued or to come, would
// otherwise wait for ours for ever; they end with wrong values, in a program that fails as a
// whole) and marks every member broken: later calls are refused, the process must restart
// to use peer stores again.
Status RunGemmPeerReduce(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         SignalingGemmArgs gemm, void* result, const char* op);

// y = x @ w cut into world blocks of rows x cols (split 0: row blocks, split 1: column
// blocks), exchanged so block s of the result comes from rank s (concat 0: stacked rows,
// concat 1: side by side).
struct AllToAllShape {
  int64_t m, n;        // the GEMM's output
  int64_t world;
  int64_t rows, cols;  // one block of y and of the result
  int split, concat;
};
// GEMM + all-to-all (gemm_all_to_all_call.cc). `gemm` writes into comm.workspace (its out is
// set here; split 0: reduce-scatter group layout; split 1: column-blocked) and signals
// comm.counters (set here, as RunGemmCollective does); a concat-1 result is staged in the workspace's second half.
Status RunGemmAllToAll(Communicator& comm, cudaStream_t stream, const AllToAllShape& shape,
                       SignalingGemmArgs gemm, void* result, bool poison_workspace,
                       const char* op);

// All-gather + GEMM (all_gather_gemm_call.cc): out[world * rows, N] = all_gather(x) @ w,
// x [rows, K] local, gathered into comm.workspace in `chunks` flagged chunks per rank
// (ncclSend/ncclRecv on a peer_to_peer communicator), or, on a collective communicator, by one
// in-place ncclAllGather over its registered window (chunks 1; with CTA policy ZERO on copy
// engines). `gemm` carries w, N, K, dtype and comm_sms; its x / m / out / layout / flags are
// set here. `gathered_out` (nullable, [world * rows, K]) receives all_gather(x) too: in
// peer-to-peer mode the rows are gathered there (the workspace is not used), in collective
// mode copied there from the window on the comm stream.
Status RunAllGatherGemm(Communicator& comm, cudaStream_t stream, const void* x, int64_t rows,
                        int chunks, SignalingGemmArgs gemm, void* out, void* gathered_out,
                        bool poison_workspace, const char* op);

// The communication half of RunGemmCollective alone (no GEMM: the workspace's contents are
// reduced as they are), in `groups` equal groups: for timing the capped NCCL calls.
Status RunCollectiveOnly(Communicator& comm, cudaStream_t stream, CollectiveKind kind,
                         int64_t m, int64_t n, GemmDType dtype, int groups, void* result,
                         const char* op);

}  // namespace flashoverlap
