// Opt-in timeline of the overlapped calls (jax_flashoverlap.trace; off by default): per call,
// when each group's rows were ready on the comm stream, when its NCCL call and its copy to
// the output finished, and when the GEMM finished, relative to the call's start. There is no
// Nsight Systems on the GPU machine; this is what tells where overlap is lost.
//
// Times come from timing cudaEvents recorded in the call's streams, drawn from a per-device
// pool (reused, never created per call once the pool holds enough). Each device keeps the
// last `capacity` calls in a ring. Off, CallTrace does nothing at all: no event is touched.
// Framework-free (no XLA, no Python).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

constexpr int kDefaultTraceCapacity = 256;
constexpr int kMaxTraceCapacity = 1 << 20;

// Turns tracing on or off for every device of this process. `capacity` (1..kMaxTraceCapacity)
// calls are kept per device from now on, the oldest dropped first. Turning it off keeps what
// was recorded, for reading.
Status SetTraceEnabled(bool enabled, int capacity);
bool TraceEnabled();

// One traced call as read back; times in ms after its start event.
struct TracedCall {
  std::string op;
  int device = -1, rank = -1, world_size = 0, comm_sms = 0;
  std::vector<int> band_rows;                  // groups + 1 boundaries (rows of the result)
  std::optional<float> gemm_done_ms;           // none: the call has no GEMM
  std::vector<float> ready_ms, comm_done_ms;   // per group
  std::optional<std::vector<float>> copy_done_ms;  // none: no copies (reduce-scatter)
};

// Every device's kept calls (devices ascending, oldest call first), after waiting on the host
// for each event. clear: empties the rings (and the dropped count). Synchronizes: call it from
// Python only, never inside an FFI handler.
Status ReadTrace(bool clear, std::vector<TracedCall>* out);

// Calls dropped because a ring was full, since the last clearing read.
int64_t TraceDropped();

// One call's trace, begun in a Run* sequence. Every method is a no-op returning Ok when
// tracing was off at Begin.
class CallTrace {
 public:
  CallTrace();
  ~CallTrace();  // an unfinished record's events go back to the pool
  CallTrace(const CallTrace&) = delete;
  CallTrace& operator=(const CallTrace&) = delete;

  // Records `start` on the compute stream (after StartCall) and orders our streams after it,
  // so every time read back is >= 0. gemm: the call launches a GEMM; copies: it copies each
  // group on the copy stream.
  Status Begin(const Communicator& comm, cudaStream_t stream, const char* op,
               const GroupLayout& layout, bool gemm, bool copies);
  Status GemmDone(cudaStream_t stream);  // compute stream, after the GEMM launch
  Status Ready(int g);                   // comm stream, after the wait for group g
  Status CommDone(int g);                // comm stream, after group g's NCCL call(s)
  Status CopyDone(int g);                // copy stream, after group g's copy
  // Keeps the record if `status` is ok (every mark must then have been made), else drops
  // it. Returns `status`, or the reason the record is incomplete.
  Status End(Status status);

  struct Record;

 private:
  Status Mark(int slot, cudaStream_t stream, const char* what, int g);  // g: -1, or the group
  Status MarkGroup(int g, int slot, cudaStream_t stream, const char* what);  // g range-checked

  std::unique_ptr<Record> record_;  // null: not traced
};

}  // namespace flashoverlap
