// Whether every rank of a group got through a setup step (AgreeAll). A setup step that fails
// on one rank only (an allocation, a load, a growth that could not wait for its calls) must
// not leave the others waiting in a collective they expect it to join; a rank that never
// comes gets the group aborted here (abort.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "xla_ffi/comm/abort.h"
#include "xla_ffi/comm/communicator.h"
#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// How long AgreeAll waits for the other ranks: a healthy rank may come up to
// kGrowWaitSeconds late (its growth first waits that long for calls in flight), so a minute
// more.
constexpr double kAgreeWaitSeconds = kGrowWaitSeconds + 60;

// One member's part of a setup collective: its NCCL call(s) on c.stream, inside the group.
using SetupEnqueue = std::function<Status(Communicator& c)>;

// Runs a setup step's collectives (`enqueue` for each member, in one NCCL group) and waits for
// them on the host, at most `wait_seconds`: a rank that failed before the step never joins it.
// On a timeout, or any failure once the group started (our part may be queued half-made while
// the others wait in theirs), every member here is aborted (AbortMembersOrExit) and the error,
// naming `what`, says the processes must restart.
Status RunBoundedSetupGroup(const std::vector<Communicator*>& comms, const SetupEnqueue& enqueue,
                            const std::string& what, double wait_seconds = kAgreeWaitSeconds,
                            double abort_grace_seconds = kAbortGraceSeconds);

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

}  // namespace flashoverlap
