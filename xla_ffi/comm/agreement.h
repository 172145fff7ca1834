// Whether every rank of a group got through a setup step (AgreeAll), and what ends a group
// whose other ranks never come (AbortMembers). A setup step that fails on one rank only
// (an allocation, a load, a growth that could not wait for its calls) must not leave the
// others waiting in a collective they expect it to join.
#pragma once

#include <string>
#include <vector>

#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"
#include "xla_ffi/comm/watchdog.h"

namespace flashoverlap {

// How long AgreeAll waits for the other ranks: a healthy rank may come up to
// kGrowWaitSeconds late (its growth first waits that long for calls in flight), so a minute
// more.
constexpr double kAgreeWaitSeconds = kGrowWaitSeconds + 60;

// How long an abort may take before the process exits instead (AbortMembersOrExit): the
// watchdog's grace.
constexpr double kAbortGraceSeconds = kExitGraceSeconds;

// Whether every rank of every member's group succeeded (`local_ok` here): one ncclMin of an
// int over each communicator, its counters (idle: no call runs during creation or a growth)
// as the scratch. Called by every rank after each creation and before each workspace is
// registered, whether its own step failed or not. Bounded: a rank that failed before it and
// never comes leaves the others waiting at most `wait_seconds`; then every member here is
// aborted (AbortMembersOrExit, `abort_grace_seconds`) and the error says so (the process must
// restart).
Status AgreeAll(const std::vector<Communicator*>& comms, bool local_ok, bool* all_ok,
                double wait_seconds = kAgreeWaitSeconds,
                double abort_grace_seconds = kAbortGraceSeconds);

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
