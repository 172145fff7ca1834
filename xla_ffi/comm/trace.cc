#include "xla_ffi/comm/trace.h"

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

namespace flashoverlap {

// Event slots: start, gemm_done, then per group ready, comm_done and (copies) copy_done.
struct CallTrace::Record {
  std::string op;
  int device = -1, rank = -1, world_size = 0, comm_sms = 0;
  std::vector<int> band_rows;
  bool gemm = false, copies = false;
  cudaStream_t comm_stream = nullptr, copy_stream = nullptr;
  std::vector<cudaEvent_t> events;
  std::vector<char> marked;  // pooled events keep older recordings: only these count

  static constexpr int kStart = 0, kGemmDone = 1;
  int groups() const { return static_cast<int>(band_rows.size()) - 1; }
  int ReadySlot(int g) const { return 2 + g; }
  int CommDoneSlot(int g) const { return 2 + groups() + g; }
  int CopyDoneSlot(int g) const { return 2 + 2 * groups() + g; }
};

namespace {

using Record = CallTrace::Record;

struct DeviceTrace {
  std::vector<cudaEvent_t> pool;             // free events of this device
  std::deque<std::unique_ptr<Record>> ring;  // kept calls, oldest first
};

struct TraceState {
  std::atomic<bool> enabled{false};
  // Guards the rest. Never held while waiting on the GPU: a handler blocked here could keep
  // its peers' NCCL calls (which a read may be waiting for) from ever being enqueued.
  std::mutex mu;
  int capacity = kDefaultTraceCapacity;
  int64_t dropped = 0;
  std::map<int, DeviceTrace> devices;
};

TraceState& State() {
  static auto* state = new TraceState();
  return *state;
}

// Callers of these two hold State().mu.
void ReturnEvents(DeviceTrace& d, Record& r) {
  d.pool.insert(d.pool.end(), r.events.begin(), r.events.end());
  r.events.clear();
}

void Trim(TraceState& s, DeviceTrace& d) {
  while (static_cast<int>(d.ring.size()) > s.capacity) {
    ReturnEvents(d, *d.ring.front());
    d.ring.pop_front();
    ++s.dropped;
  }
}

void Release(std::unique_ptr<Record> r) {
  TraceState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  ReturnEvents(s.devices[r->device], *r);
}

// Tops `events` up to `count` from `device`'s pool, creating events only where it runs short.
Status TakeEvents(int device, size_t count, std::vector<cudaEvent_t>* events) {
  TraceState& s = State();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    std::vector<cudaEvent_t>& pool = s.devices[device].pool;
    while (events->size() < count && !pool.empty()) {
      events->push_back(pool.back());
      pool.pop_back();
    }
  }
  if (events->size() == count) return Status::Ok();
  int current = -1;  // handlers run on `device` already; other callers may not
  FO_RETURN_IF_CUDA(cudaGetDevice(&current));
  if (current != device) FO_RETURN_IF_CUDA(cudaSetDevice(device));
  Status status;
  while (status.ok() && events->size() < count) {
    cudaEvent_t e = nullptr;
    status = CudaStatus(cudaEventCreate(&e), "cudaEventCreate (trace)");
    if (status.ok()) events->push_back(e);
  }
  if (current != device) {
    Status back = CudaStatus(cudaSetDevice(current), "cudaSetDevice");
    if (status.ok()) status = back;
  }
  return status;
}

Status Elapsed(const Record& r, int slot, float* ms) {
  FO_RETURN_IF_CUDA(cudaEventSynchronize(r.events[slot]));
  return CudaStatus(cudaEventElapsedTime(ms, r.events[Record::kStart], r.events[slot]),
                    "cudaEventElapsedTime");
}

Status Times(const Record& r, TracedCall* c) {
  c->op = r.op;
  c->device = r.device;
  c->rank = r.rank;
  c->world_size = r.world_size;
  c->comm_sms = r.comm_sms;
  c->band_rows = r.band_rows;
  FO_RETURN_IF_CUDA(cudaEventSynchronize(r.events[Record::kStart]));
  float ms = 0;
  if (r.gemm) {
    FO_RETURN_IF_NOT_OK(Elapsed(r, Record::kGemmDone, &ms));
    c->gemm_done_ms = ms;
  }
  if (r.copies) c->copy_done_ms.emplace();
  for (int g = 0; g < r.groups(); ++g) {
    FO_RETURN_IF_NOT_OK(Elapsed(r, r.ReadySlot(g), &ms));
    c->ready_ms.push_back(ms);
    FO_RETURN_IF_NOT_OK(Elapsed(r, r.CommDoneSlot(g), &ms));
    c->comm_done_ms.push_back(ms);
    if (r.copies) {
      FO_RETURN_IF_NOT_OK(Elapsed(r, r.CopyDoneSlot(g), &ms));
      c->copy_done_ms->push_back(ms);
    }
  }
  return Status::Ok();
}

// What a successful call left unrecorded (a wiring bug in its Run* sequence), or "".
std::string Missing(const Record& r) {
  static const char* const kGroupEvents[] = {"ready", "comm_done", "copy_done"};
  for (size_t slot = 0; slot < r.events.size(); ++slot) {
    if (r.marked[slot] || (slot == Record::kGemmDone && !r.gemm)) continue;
    if (slot < 2) return slot == Record::kStart ? "start" : "gemm_done";
    const int i = static_cast<int>(slot) - 2;
    return std::string(kGroupEvents[i / r.groups()]) + " of group " +
           std::to_string(i % r.groups());
  }
  return "";
}

}  // namespace

Status SetTraceEnabled(bool enabled, int capacity) {
  if (capacity < 1 || capacity > kMaxTraceCapacity) {
    return Status::Error("trace capacity must be in [1, " + std::to_string(kMaxTraceCapacity) +
                         "], got " + std::to_string(capacity));
  }
  TraceState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.capacity = capacity;
  for (auto& [device, d] : s.devices) Trim(s, d);
  s.enabled.store(enabled);
  return Status::Ok();
}

bool TraceEnabled() { return State().enabled.load(std::memory_order_relaxed); }

int64_t TraceDropped() {
  TraceState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.dropped;
}

Status ReadTrace(bool clear, std::vector<TracedCall>* out) {
  TraceState& s = State();
  // The calls are taken out while waiting on them (no lock held, no event reused meanwhile),
  // then put back in front of any recorded since, unless cleared.
  std::map<int, std::deque<std::unique_ptr<Record>>> taken;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& [device, d] : s.devices) {
      if (!d.ring.empty()) taken[device] = std::exchange(d.ring, {});
    }
  }
  Status status;
  int current = -1;
  if (!taken.empty()) status = CudaStatus(cudaGetDevice(&current), "cudaGetDevice");
  for (auto& [device, calls] : taken) {
    if (status.ok()) status = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
    for (auto& r : calls) {
      if (!status.ok()) break;
      TracedCall c;
      status = Times(*r, &c);
      if (status.ok()) {
        out->push_back(std::move(c));
      } else {
        status = Status::Error("reading the trace of " + r->op + " on device " +
                               std::to_string(device) + ": " + status.message);
      }
    }
  }
  if (current >= 0) {
    Status back = CudaStatus(cudaSetDevice(current), "cudaSetDevice");
    if (status.ok()) status = back;
  }
  const bool drop = clear && status.ok();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& [device, calls] : taken) {
    DeviceTrace& d = s.devices[device];
    if (drop) {
      for (auto& r : calls) ReturnEvents(d, *r);
      continue;
    }
    for (auto it = calls.rbegin(); it != calls.rend(); ++it) d.ring.push_front(std::move(*it));
    Trim(s, d);
  }
  if (drop) s.dropped = 0;
  if (!status.ok()) out->clear();
  return status;
}

CallTrace::CallTrace() = default;

CallTrace::~CallTrace() {
  if (record_) Release(std::move(record_));
}

Status CallTrace::Begin(const Communicator& comm, cudaStream_t stream, const char* op,
                        const GroupLayout& layout, bool gemm, bool copies) {
  if (!TraceEnabled()) return Status::Ok();
  record_ = std::make_unique<Record>();
  Record& r = *record_;
  r.op = op;
  r.device = comm.device;
  r.rank = comm.rank;
  r.world_size = comm.world_size;
  r.comm_sms = comm.comm_sms;
  r.band_rows.assign(layout.band_rows, layout.band_rows + layout.num_groups + 1);
  r.gemm = gemm;
  r.copies = copies;
  r.comm_stream = comm.stream;
  r.copy_stream = comm.copy_stream;
  const size_t count = 2 + static_cast<size_t>(copies ? 3 : 2) * layout.num_groups;
  FO_RETURN_IF_NOT_OK(TakeEvents(comm.device, count, &r.events));
  r.marked.assign(count, 0);
  FO_RETURN_IF_NOT_OK(Mark(Record::kStart, stream, "start", -1));
  // Our streams were ordered after StartCall's event, just before `start` on the same
  // stream; waiting for `start` itself makes every later time >= 0 by construction.
  FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.stream, r.events[Record::kStart], 0));
  if (copies) FO_RETURN_IF_CUDA(cudaStreamWaitEvent(comm.copy_stream, r.events[Record::kStart], 0));
  return Status::Ok();
}

Status CallTrace::Mark(int slot, cudaStream_t stream, const char* what, int g) {
  cudaError_t err = cudaEventRecord(record_->events[slot], stream);
  if (err != cudaSuccess) {  // the message is built only here: nothing allocates per mark
    std::string event = std::string("cudaEventRecord (trace event ") + what +
                        (g >= 0 ? " of group " + std::to_string(g) : std::string()) + ")";
    return CudaStatus(err, event.c_str());
  }
  record_->marked[slot] = 1;
  return Status::Ok();
}

Status CallTrace::MarkGroup(int g, int slot, cudaStream_t stream, const char* what) {
  if (g < 0 || g >= record_->groups()) {
    return Status::Error(std::string("trace: ") + what + " of group " + std::to_string(g) +
                         " in a call of " + std::to_string(record_->groups()) + " groups");
  }
  return Mark(slot, stream, what, g);
}

Status CallTrace::GemmDone(cudaStream_t stream) {
  if (!record_) return Status::Ok();
  if (!record_->gemm) return Status::Error("trace: GemmDone in a call begun without a GEMM");
  return Mark(Record::kGemmDone, stream, "gemm_done", -1);
}

Status CallTrace::Ready(int g) {
  if (!record_) return Status::Ok();
  return MarkGroup(g, record_->ReadySlot(g), record_->comm_stream, "ready");
}

Status CallTrace::CommDone(int g) {
  if (!record_) return Status::Ok();
  return MarkGroup(g, record_->CommDoneSlot(g), record_->comm_stream, "comm_done");
}

Status CallTrace::CopyDone(int g) {
  if (!record_) return Status::Ok();
  if (!record_->copies) return Status::Error("trace: CopyDone in a call begun without copies");
  return MarkGroup(g, record_->CopyDoneSlot(g), record_->copy_stream, "copy_done");
}

Status CallTrace::End(Status status) {
  if (!record_) return status;
  std::unique_ptr<Record> r = std::move(record_);
  if (status.ok()) {
    std::string missing = Missing(*r);
    if (missing.empty()) {
      TraceState& s = State();
      std::lock_guard<std::mutex> lock(s.mu);
      DeviceTrace& d = s.devices[r->device];
      d.ring.push_back(std::move(r));
      Trim(s, d);
      return status;
    }
    status = Status::Error(r->op + ": trace left " + missing + " unrecorded");
  }
  Release(std::move(r));
  return status;
}

}  // namespace flashoverlap
