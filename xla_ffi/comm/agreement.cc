#include "xla_ffi/comm/agreement.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <utility>

#include "xla_ffi/comm/stream_wait.h"

namespace flashoverlap {
namespace {

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", s);
  return text;
}

}  // namespace

Status RunBoundedSetupGroup(const std::vector<Communicator*>& comms, const SetupEnqueue& enqueue,
                            const std::string& what, double wait_seconds,
                            double abort_grace_seconds) {
  // From the group start on, a failure here may leave our part of the collective queued or
  // half-made while the others wait in theirs: abort the members, as on a timeout.
  auto give_up = [&comms, abort_grace_seconds](const std::string& why) {
    Status aborted = AbortMembersOrExit(comms, why, abort_grace_seconds);
    return Status::Error(why + "; this process's members of the group are aborted: restart "
                         "the processes" +
                         (aborted.ok() ? "" : " (aborting failed too: " + aborted.message + ")"));
  };
  auto failed = [&give_up, &what](const std::string& message) {
    return give_up(message + " (" + what + ")");
  };
  std::vector<std::pair<int, cudaStream_t>> streams;
  for (Communicator* c : comms) streams.emplace_back(c->device, c->stream);
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return failed(NcclStatus(res, "ncclGroupStart").message);
  for (Communicator* c : comms) {
    Status s = enqueue(*c);
    if (!s.ok()) {
      ncclGroupEnd();  // closes the group only: `s` is the error, and the members are aborted
      return failed(s.message);
    }
  }
  res = ncclGroupEnd();
  if (res != ncclSuccess) return failed(NcclStatus(res, "ncclGroupEnd").message);
  // Not cudaStreamSynchronize: a rank that failed before this step never joins.
  bool timed_out = false;
  Status waited = WaitStreamsIdle(streams, wait_seconds, &timed_out);
  if (!waited.ok()) return failed(waited.message);
  if (timed_out) {
    return give_up("the group's other ranks did not join the " + what + " within " +
                   Seconds(wait_seconds) + " s (a rank failed before it: its own error names why)");
  }
  return Status::Ok();
}

Status AgreeAll(const std::vector<Communicator*>& comms, bool local_ok, bool* all_ok,
                double wait_seconds, double abort_grace_seconds) {
  *all_ok = false;
  for (Communicator* c : comms) {
    FO_RETURN_IF_CUDA(cudaSetDevice(c->device));
    // The counters' zeroing at creation ran on the legacy stream, which our non-blocking
    // stream does not follow (only that stream: other work on the device may be anything).
    FO_RETURN_IF_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    FO_RETURN_IF_CUDA(cudaMemsetAsync(c->counters, local_ok ? 1 : 0, sizeof(int32_t), c->stream));
  }
  Status agreed_all = RunBoundedSetupGroup(
      comms,
      [](Communicator& c) {
        return NcclStatus(
            ncclAllReduce(c.counters, c.counters, 1, ncclInt32, ncclMin, c.comm, c.stream),
            "ncclAllReduce");
      },
      "setup agreement", wait_seconds, abort_grace_seconds);
  if (!agreed_all.ok()) return agreed_all;
  *all_ok = true;
  for (Communicator* c : comms) {
    int32_t agreed = 0;
    FO_RETURN_IF_CUDA(cudaSetDevice(c->device));
    FO_RETURN_IF_CUDA(cudaMemcpy(&agreed, c->counters, sizeof(int32_t), cudaMemcpyDeviceToHost));
    FO_RETURN_IF_CUDA(cudaMemsetAsync(c->counters, 0, sizeof(int32_t), c->stream));
    FO_RETURN_IF_CUDA(cudaStreamSynchronize(c->stream));
    if (agreed == 0) *all_ok = false;
  }
  return Status::Ok();
}

}  // namespace flashoverlap
