// Aborting this process's members of a group: what ends their calls when the group's other
// ranks never come (the watchdog, the setup agreement's bound, a destroy after a watchdog
// abort), one way for all three.
#pragma once

#include <string>
#include <vector>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {

// How long an abort may take before the process exits instead (AbortMembersOrExit): the
// watchdog's grace.
constexpr double kAbortGraceSeconds = kExitGraceSeconds;

// Ends what every member not yet aborted may still run (its watchdog flag set for our spin
// kernels, ncclCommAbort for NCCL's kernels waiting for a peer) and marks it aborted: its
// later calls refuse. The caller holds the members (no call enqueues meanwhile). Returns
// the first failure, going on past it.
Status AbortMembers(const std::vector<Communicator*>& comms);

// AbortMembers with a deadline. ncclCommAbort can wait for ever: for a kernel of NCCL's
// waiting on a peer that never comes (2 x H200, NCCL 2.28: the watchdog's case) or for work
// queued before it. If it has not returned `grace_seconds` later, prints `why` and that, and
// exits the process with status 134 (as the watchdog does) instead of hanging; the members are
// kept alive (never freed before exit) for the thread still in the abort.
Status AbortMembersOrExit(const std::vector<Communicator*>& comms, const std::string& why,
                          double grace_seconds = kAbortGraceSeconds);

}  // namespace flashoverlap
