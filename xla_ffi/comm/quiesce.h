// Waiting until no call of a group's local communicators is in flight, and holding them so:
// what growing their workspaces (EnsureWorkspace) or destroying them (DestroyCommunicators)
// needs, with programs possibly running on other threads.
//
// A call reads its communicator's workspace under comm.call_mutex (UseWorkspace), and records
// comm.call_done on the compute stream once everything it enqueued has joined back
// (FinishCall). So with every member's call mutex held and every call_done complete, no call
// uses a workspace and none can start: the buffers may be swapped.
//
// Never holds one member's mutex while blocking on another's, and lets go of them all when a
// member stays busy (after 1 ms, then longer each round, at most 1 s): a call in flight on one
// device may wait for its peer's call on another device (a collective), whose handler needs
// that peer's mutex to enqueue it. Letting go for a moment lets such a peer come. Within one
// process the members then switch at the same call (a collective in flight keeps them all
// busy); across processes nothing here agrees on a point (README: lower on the thread that
// runs).
#pragma once

#include <mutex>
#include <vector>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"

namespace flashoverlap {

using CallLocks = std::vector<std::unique_lock<std::mutex>>;

// Returns with every member of `comms` locked (in *locks) and idle, or an error, holding
// nothing, when a member was (or is being) aborted by the watchdog, a CUDA query failed, or
// the members were not idle at once within `timeout_seconds` (checked between rounds).
Status QuiesceMembers(const std::vector<Communicator*>& comms, double timeout_seconds,
                      CallLocks* locks);

// Every member's call mutex, without waiting for their calls on the GPU (never blocking on one
// mutex while holding another): after a watchdog abort, when calls may never drain.
CallLocks LockMembers(const std::vector<Communicator*>& comms);

}  // namespace flashoverlap
