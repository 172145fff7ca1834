#include "xla_ffi/comm/quiesce.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {
namespace {

using Clock = std::chrono::steady_clock;

// Whether every member's last call has finished on the GPU (its call_done is complete).
Status AllIdle(const std::vector<Communicator*>& comms, bool* idle, int* busy_device) {
  *idle = true;
  for (Communicator* c : comms) {
    // The flag: the watchdog is aborting it (Abort sets it first, then waits for the mutex).
    if (IsAborted(c)) {
      return Status::Error("a communicator of this group was aborted by the watchdog; "
                           "restart the process");
    }
    cudaError_t err = cudaEventQuery(c->call_done);
    if (err == cudaErrorNotReady) {
      if (*idle) *busy_device = c->device;
      *idle = false;
    } else if (err != cudaSuccess) {
      return CudaStatus(err, "cudaEventQuery (call_done)");
    }
  }
  return Status::Ok();
}

}  // namespace

// Blocks on one member's mutex while holding none, try-locks the others, and on a miss lets go
// of all and starts again from the busy one (std::lock's scheme).
CallLocks LockMembers(const std::vector<Communicator*>& comms) {
  size_t first = 0;
  for (;;) {
    CallLocks locks;
    if (comms.empty()) return locks;
    locks.emplace_back(comms[first]->call_mutex);
    size_t busy = comms.size();
    for (size_t i = 0; i < comms.size() && busy == comms.size(); ++i) {
      if (i == first) continue;
      std::unique_lock<std::mutex> lock(comms[i]->call_mutex, std::try_to_lock);
      if (lock.owns_lock()) {
        locks.push_back(std::move(lock));
      } else {
        busy = i;
      }
    }
    if (busy == comms.size()) return locks;
    first = busy;
    std::this_thread::yield();
  }
}

Status QuiesceMembers(const std::vector<Communicator*>& comms, double timeout_seconds,
                      CallLocks* locks) {
  locks->clear();
  if (comms.empty()) return Status::Ok();
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(timeout_seconds, 0.0)));
  // How long to hold the mutexes waiting for calls to drain before letting peers in: short
  // first (a peer's handler may be waiting for them), longer while calls keep coming.
  auto hold = std::chrono::milliseconds(1);
  int busy_device = -1;
  for (;;) {
    *locks = LockMembers(comms);
    const auto until = std::min(Clock::now() + hold, deadline);
    for (;;) {
      bool idle = false;
      Status status = AllIdle(comms, &idle, &busy_device);
      if (!status.ok()) {
        locks->clear();
        return status;
      }
      if (idle) return Status::Ok();
      if (Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    locks->clear();
    if (Clock::now() >= deadline) {
      return Status::Error("calls on these communicators were still running after " +
                           std::to_string(static_cast<int>(timeout_seconds)) + " s (last seen busy: device " +
                           std::to_string(busy_device) + "; another thread running programs "
                           "on this mesh without pause, or a call whose peer never came)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    hold = std::min(hold * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace flashoverlap
