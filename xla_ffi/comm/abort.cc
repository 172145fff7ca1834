#include "xla_ffi/comm/abort.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

namespace flashoverlap {

Status AbortMembers(const std::vector<Communicator*>& comms) {
  Status first = Status::Ok();
  for (Communicator* c : comms) {
    if (c->aborted.exchange(true)) continue;
    RaiseAbortFlag(c->abort_flag);
    Status s = CudaStatus(cudaSetDevice(c->device), "cudaSetDevice");
    if (s.ok() && c->comm != nullptr) s = NcclStatus(ncclCommAbort(c->comm), "ncclCommAbort");
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Status AbortMembersOrExit(const std::vector<Communicator*>& comms, const std::string& why,
                          double grace_seconds) {
  struct Outcome {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    Status status;
  };
  auto outcome = std::make_shared<Outcome>();  // outlives this call if the abort never returns
  try {
    std::thread([outcome, comms] {
      Status s = AbortMembers(comms);
      std::lock_guard<std::mutex> lock(outcome->mutex);
      outcome->status = s;
      outcome->done = true;
      outcome->done_cv.notify_all();
    }).detach();
  } catch (const std::exception&) {
    return AbortMembers(comms);  // no thread to be had: abort from here, unbounded
  }
  std::unique_lock<std::mutex> lock(outcome->mutex);
  const bool done = outcome->done_cv.wait_for(
      lock, std::chrono::duration<double>(grace_seconds), [&outcome] { return outcome->done; });
  if (!done) {
    std::fprintf(stderr,
                 "jax_flashoverlap: %s; aborting this process's communicators of the group did "
                 "not end within %g s (NCCL waits for a kernel that never stops); exiting the "
                 "process (status 134) instead of hanging.\n",
                 why.c_str(), grace_seconds);
    std::fflush(stderr);
    std::_Exit(134);
  }
  return outcome->status;
}

}  // namespace flashoverlap
