#include "xla_ffi/comm/fault_injection.h"

#include <map>
#include <mutex>

#include <cuda_runtime.h>
#include <nccl.h>

namespace flashoverlap {
namespace {

struct Armed {
  std::mutex mu;
  FaultKind kind = FaultKind::kNone;
  int calls = 0;                 // per device
  std::map<int, int> used;       // device -> calls failed since armed
};

Armed& State() {
  static Armed* state = new Armed();
  return *state;
}

}  // namespace

void SetFaultInjection(FaultKind kind, int calls) {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.kind = calls > 0 ? kind : FaultKind::kNone;
  s.calls = calls > 0 ? calls : 0;
  s.used.clear();
}

Status TakeInjectedFault(int device) {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.kind == FaultKind::kNone || s.kind == FaultKind::kHang || s.used[device] >= s.calls) {
    return Status::Ok();
  }
  ++s.used[device];
  if (s.kind == FaultKind::kNccl) {
    return NcclStatus(ncclRemoteError, "NCCL call (injected fault: comm.inject_faults)");
  }
  return CudaStatus(cudaErrorLaunchFailure, "CUDA call (injected fault: comm.inject_faults)");
}

bool TakeInjectedHang(int device) {
  Armed& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.kind != FaultKind::kHang || s.used[device] >= s.calls) return false;
  ++s.used[device];
  return true;
}

}  // namespace flashoverlap
