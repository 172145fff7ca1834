// Injected failures, for testing the error path of the overlapped calls (never on by itself):
// jax_flashoverlap.comm.inject_faults(kind, calls) makes the next `calls` overlapped calls on
// every device of this process fail at their first communication step, as if the NCCL (or a
// CUDA) call there had returned an error. Every rank of a call fails alike (the fault is
// armed on every device), so no peer is left waiting; the call still joins its streams, and
// the next call must run normally. A failure on one rank only is the watchdog's case
// (watchdog.h): kHang (C++ tests only, the peer-store calls) makes a call wait for a word no
// rank ever writes, as if a peer never came, which only the watchdog ends.
#pragma once

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

enum class FaultKind : int { kNone = 0, kNccl = 1, kCuda = 2, kHang = 3 };

// Arms (or with kNone / calls == 0, disarms) the next `calls` calls of every device.
void SetFaultInjection(FaultKind kind, int calls);

// At a call's first communication step on `device`: the injected error if one is armed for
// this device (and uses it up), else Ok (kHang: Ok, not used up).
Status TakeInjectedFault(int device);

// Whether this call on `device` is to hang (kHang armed for it; uses it up).
bool TakeInjectedHang(int device);

}  // namespace flashoverlap
