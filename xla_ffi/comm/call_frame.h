// What every overlapped call does the same way around its own work (overlap_calls.h):
// starting on the compute stream (counters reset, our streams ordered after it), launching
// the signaling GEMM, and finishing (watchdog registration, our streams joined back to the
// compute stream whatever happened, the error naming the op).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <exception>
#include <string>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// NCCL's name for the GEMM's element type.
inline ncclDataType_t NcclType(GemmDType dtype) {
  return dtype == GemmDType::kBFloat16 ? ncclBfloat16 : ncclFloat16;
}

// The first step of every call, under comm.call_mutex: refuses a destroyed communicator (a
// handler that found it just before DestroyCommunicators) or one the watchdog aborted, and
// orders `stream` after the communicator's previous call (its call_done): the counters, tile
// queue and workspace are the communicator's, one call at a time, even should two calls come
// on different streams.
Status BeginCall(const Communicator& comm, cudaStream_t stream, const char* op);

// Resets the first `counters` counters on `stream` (0: none), then orders our comm stream
// (and the copy stream when `copies`) after everything queued on `stream` so far.
Status StartCall(Communicator& comm, cudaStream_t stream, int counters, bool copies);

// A call whose whole sequence runs on `stream` (peer stores: nothing on the comm stream):
// orders the comm stream after everything queued on `stream` so far, so that the watchdog's
// abort check and its end of the call (FinishCall) follow the sequence, not only its start.
Status FollowOnCommStream(Communicator& comm, cudaStream_t stream);

// The communicator's workspace for this call, under comm.call_mutex (EnsureWorkspace swaps it
// only under that mutex): an error naming `op` unless it holds `bytes` (0: any, even none);
// with `poison`, filled with NaN bytes on `stream` first (poison.h's test switch), so a GEMM
// tile that read rows before they arrived shows.
Status UseWorkspace(const Communicator& comm, cudaStream_t stream, size_t bytes, bool poison,
                    const char* op, char** workspace);

// LaunchSignalingGemm with the communicator's tile queue, and its reason on failure.
Status LaunchGemm(Communicator& comm, SignalingGemmArgs args, cudaStream_t stream);

// Helper launches (signaling_gemm.h): FLASHOVERLAP_GEMM_HELPERS=on asks for them (read at
// every call, like the launcher's switches; unset, empty or `off`: none; any other value is
// an error here, and at lowering in Python). PrepareGemmHelpers sets `args` up for them when
// asked; after LaunchGemm, HelperClusters() says whether the launcher planned any (0: none).
Status PrepareGemmHelpers(Communicator& comm, SignalingGemmArgs& args);
int HelperClusters();
// Orders the comm stream after the GEMM's queue reset (before the first helper launch).
Status WaitForQueueReset(Communicator& comm);
// One helper launch on the comm stream: units of groups <= until_group (LaunchGemm's args).
Status LaunchGemmHelpers(Communicator& comm, SignalingGemmArgs args, int until_group);

// The steps of a call between BeginCall and FinishCall, an exception out of them (a failed
// allocation: a message, a trace record, the launcher's plan) turned into an error: unwound
// to the handler's NoThrow, it would skip FinishCall's join-back (XLA's stream running ahead
// of our queued work) and a peer-store call's release of its group (the others waiting).
template <typename Steps>
Status CatchExceptions(Steps steps) {
  try {
    return steps();
  } catch (const std::exception& e) {
    return Status::Error(std::string("C++ exception: ") + e.what());
  } catch (...) {
    return Status::Error("unknown C++ exception");
  }
}

// Watches the call (watchdog on, `status` ok), then makes `stream` wait for our comm stream
// (and the copy stream when `copies`) whatever `status` says, so the compute stream never
// runs ahead of queued work and the next call never overwrites a span still in flight.
// Then records comm.call_done on `stream` (quiesce.h).
// Returns `status` (or the first failure of this step), prefixed with `op`. Every Run* sequence
// ends here, whatever failed (a failed StartCall too: joining is harmless then).
Status FinishCall(Communicator& comm, cudaStream_t stream, bool copies, Status status,
                  const char* op);

}  // namespace flashoverlap
