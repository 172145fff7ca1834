#include "xla_ffi/comm/watchdog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xla_ffi/comm/abort.h"
#include "xla_ffi/comm/communicator.h"

namespace flashoverlap {
namespace {

using Clock = std::chrono::steady_clock;

struct WatchedCall {
  Communicator* comm;
  const char* op;        // a string literal of the handler
  cudaEvent_t started;   // recorded on comm->stream where the call's work begins
  cudaEvent_t done;      // recorded on comm->stream after the call's last operation
  bool running = false;  // `started` has completed: the timeout counts from `start`
  Clock::time_point start;
  bool fired = false;
  Clock::time_point fired_at;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One thread for the process, started with the first watched call; never joined (it lives
// until exit, like the process's CUDA contexts), so the state is leaked on purpose.
class Watchdog {
 public:
  static Watchdog& Get() {
    static Watchdog* dog = new Watchdog();
    return *dog;
  }

  // An event of comm's device, from the spares or new.
  Status TakeEvent(int device, cudaEvent_t* event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < spare_.size(); ++i) {
        if (spare_[i].first == device) {
          *event = spare_[i].second;
          spare_.erase(spare_.begin() + i);
          return Status::Ok();
        }
      }
    }
    return CudaStatus(cudaEventCreateWithFlags(event, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags");
  }

  void GiveBack(int device, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mu_);
    spare_.push_back({device, event});
  }

  // The watchdog thread is started here, at communicator creation (an error can be returned
  // there), never inside a handler.
  Status Start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return Status::Ok();
    try {
      std::thread([this] { Loop(); }).detach();
    } catch (const std::exception& err) {
      return Status::Error(std::string("could not start the watchdog thread: ") + err.what());
    }
    started_ = true;
    return Status::Ok();
  }

  Status Watch(Communicator& comm, const char* op, cudaEvent_t started) {
    cudaEvent_t done = nullptr;
    Status status = TakeEvent(comm.device, &done);
    if (status.ok()) status = CudaStatus(cudaEventRecord(done, comm.stream), "cudaEventRecord");
    if (!status.ok()) {
      GiveBack(comm.device, started);
      if (done != nullptr) GiveBack(comm.device, done);
      return status;
    }
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({&comm, op, started, done});
    return Status::Ok();
  }

  // Drops the calls of a communicator that is being destroyed; their events go back to the
  // spares (the device outlives the communicator), not leaked at every destroy.
  void Forget(const Communicator* comm) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < calls_.size();) {
      if (calls_[i].comm == comm) {
        spare_.push_back({comm->device, calls_[i].started});
        spare_.push_back({comm->device, calls_[i].done});
        calls_.erase(calls_.begin() + i);
      } else {
        ++i;
      }
    }
  }

 private:
  void Loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::vector<Communicator*> to_abort;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const Clock::time_point now = Clock::now();
        for (size_t i = 0; i < calls_.size();) {
          WatchedCall& call = calls_[i];
          // Best effort (nobody to tell here): an event is queried on any device all the same.
          if (cudaSetDevice(call.comm->device) != cudaSuccess) cudaGetLastError();
          cudaError_t state = cudaEventQuery(call.done);
          if (state == cudaErrorNotReady && !call.running) {
            // Not timed while the GPU has not reached the call: work queued before it (the
            // rest of the program, later steps JAX dispatched ahead) may take any time.
            state = cudaEventQuery(call.started);
            if (state == cudaSuccess) {
              call.running = true;
              call.start = now;
            }
            if (state == cudaSuccess || state == cudaErrorNotReady) {
              ++i;
              continue;
            }
          }
          if (state == cudaSuccess) {
            spare_.push_back({call.comm->device, call.started});
            spare_.push_back({call.comm->device, call.done});
            calls_.erase(calls_.begin() + i);
            continue;
          }
          if (state != cudaErrorNotReady) {  // e.g. the trap's error: XLA reports it
            cudaGetLastError();
            calls_.erase(calls_.begin() + i);
            continue;
          }
          if (!call.fired && Seconds(now - call.start) > call.comm->watchdog_seconds) {
            call.fired = true;
            call.fired_at = now;
            Report(call, now);
            to_abort.push_back(call.comm);
          } else if (call.fired && Seconds(now - call.fired_at) > kExitGraceSeconds) {
            std::fprintf(stderr,
                         "jax_flashoverlap watchdog: %s on device %d did not stop %.0f s after "
                         "its communicator was aborted; exiting the process (status 134) "
                         "instead of hanging.\n",
                         call.op, call.comm->device, kExitGraceSeconds);
            std::fflush(stderr);
            std::_Exit(134);
          }
          ++i;
        }
      }
      // Aborting may block (NCCL can wait for kernels that never stop): never in this loop,
      // which must stay free to apply the grace deadline above.
      for (Communicator* comm : to_abort) {
        try {
          std::thread([comm] { Abort(*comm); }).detach();
        } catch (const std::exception&) {
          Abort(*comm);  // no thread to be had: abort from here (the deadline may then wait)
        }
      }
    }
  }

  static void Report(const WatchedCall& call, Clock::time_point now) {
    const Communicator& c = *call.comm;
    std::fprintf(stderr,
                 "jax_flashoverlap watchdog: %s (comm_id %lld, device %d, rank %d of %d) has "
                 "not finished after %.1f s (JAX_FLASHOVERLAP_WATCHDOG_S=%g): another rank is "
                 "probably not taking part (it failed, hangs, or runs a different program). "
                 "Aborting the communicator: the call fails with a CUDA error and this "
                 "process must be restarted.\n",
                 call.op, static_cast<long long>(c.comm_id), c.device, c.rank, c.world_size,
                 Seconds(now - call.start), c.watchdog_seconds);
    std::fflush(stderr);
  }

  // Sets the flag the spin-wait and check kernels read, then lets NCCL's kernels go.
  static void Abort(Communicator& comm) {
    RaiseAbortFlag(comm.abort_flag);
    // ncclCommAbort frees the communicator: only with its call mutex (AbortMembers' contract),
    // never while a handler is in NCCL on it or a growth / destroy holds it (a growth sees the
    // flag and gives up, quiesce.cc; a destroy aborts the group itself). It once went ahead
    // after 1 s, and a handler blocked while holding the mutex then went on with a freed
    // communicator. Such a handler usually lets go once the flag traps the spin waits it
    // queues behind; one blocked on the host (in NCCL's enqueue) may not, and its trapped
    // call has left the watch list and the loop's deadline: this wait has its own, the same.
    std::unique_lock<std::mutex> lock(comm.call_mutex, std::defer_lock);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(kExitGraceSeconds));
    while (!lock.try_lock()) {
      if (Clock::now() > deadline) {
        std::fprintf(stderr,
                     "jax_flashoverlap watchdog: could not abort comm_id %lld on device %d: its "
                     "call mutex stayed held for %.0f s (a call blocked while enqueueing, or a "
                     "setup step); exiting the process (status 134) instead of hanging.\n",
                     static_cast<long long>(comm.comm_id), comm.device, kExitGraceSeconds);
        std::fflush(stderr);
        std::_Exit(134);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (comm.destroyed.load()) return;
    // Unbounded here: the loop's grace deadline ends the process if this never returns.
    Status aborted = AbortMembers({&comm});
    if (!aborted.ok()) {
      std::fprintf(stderr, "jax_flashoverlap watchdog: %s\n", aborted.message.c_str());
    }
  }

  std::mutex mu_;
  std::vector<WatchedCall> calls_;
  std::vector<std::pair<int, cudaEvent_t>> spare_;  // (device, event) ready for reuse
  bool started_ = false;
};

}  // namespace

Status InitWatchdog(Communicator& comm) {
  if (comm.watchdog_seconds <= 0) return Status::Ok();
  FO_RETURN_IF_NOT_OK(Watchdog::Get().Start());
  void* flag = nullptr;
  FO_RETURN_IF_CUDA(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  comm.abort_flag = static_cast<volatile int*>(flag);
  *comm.abort_flag = 0;
  return Status::Ok();
}

// The abort flag's host page stays: an abort that fired just before (its thread detached)
// sets the flag before it can see that the communicator was destroyed.
Status FreeWatchdog(Communicator& comm) {
  Watchdog::Get().Forget(&comm);
  WatchAbandon(comm);
  return Status::Ok();
}

bool IsAborted(const Communicator* c) { return c->aborted.load() || AbortFlagRaised(c->abort_flag); }

Status CheckNotAborted(const Communicator& comm, const char* op) {
  if (!comm.aborted) return Status::Ok();
  return Status::Error(std::string(op) + ": the watchdog aborted this communicator (comm_id " +
                       std::to_string(comm.comm_id) + ", device " + std::to_string(comm.device) +
                       ") after an earlier call hung; restart the process");
}

Status WatchStart(Communicator& comm) {
  if (comm.watchdog_seconds <= 0) return Status::Ok();
  WatchAbandon(comm);  // a start of an earlier call that failed before its end (none: no-op)
  cudaEvent_t started = nullptr;
  FO_RETURN_IF_NOT_OK(Watchdog::Get().TakeEvent(comm.device, &started));
  cudaError_t err = cudaEventRecord(started, comm.stream);
  if (err != cudaSuccess) {
    Watchdog::Get().GiveBack(comm.device, started);
    return CudaStatus(err, "cudaEventRecord");
  }
  comm.watch_started = started;
  return Status::Ok();
}

void WatchAbandon(Communicator& comm) {
  if (comm.watch_started == nullptr) return;
  Watchdog::Get().GiveBack(comm.device, comm.watch_started);
  comm.watch_started = nullptr;
}

Status WatchCall(Communicator& comm, const char* op) {
  if (comm.watchdog_seconds <= 0) return Status::Ok();
  if (comm.watch_started == nullptr) {
    return Status::Error("watchdog: the call's start was not recorded (WatchStart)");
  }
  cudaEvent_t started = comm.watch_started;
  comm.watch_started = nullptr;
  Status status = CudaStatus(LaunchAbortCheck(comm.stream, comm.abort_flag), "abort check kernel");
  if (!status.ok()) {
    Watchdog::Get().GiveBack(comm.device, started);
    return status;
  }
  return Watchdog::Get().Watch(comm, op, started);
}

}  // namespace flashoverlap
