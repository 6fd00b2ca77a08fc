#pragma once
// hyperpar-train --profile PATH: one Chrome trace JSON for all ranks (core/profiler.h's
// events; open it in https://ui.perfetto.dev or chrome://tracing). Each rank is a process
// ("rank 3") with two threads: "compute" (forward/backward per block, optimizer, FSDP copies,
// blocking collectives and waits) and "collectives in flight" (asynchronous collectives from
// issue until completion was seen). Timestamps are the hosts' monotonic clocks, shifted so
// the first event is at 0; ranks on one host share the clock, across hosts they may be
// offset.
//
// The summary rank 0 prints (and returns) states per rank, as means over the profiled steps:
// the step time, the time in blocking collectives (TP, EP: the rank cannot compute), the time
// at least one asynchronous collective (FSDP's gathers and reduce-scatters) was in flight,
// and how much of that the rank spent waiting for one: the rest was hidden behind compute.
#include <string>

#include "hyperpar/comm/communicator.h"

namespace hyperpar::train {

/// Collective over `world`: takes this rank's events, gathers them on rank 0, which writes
/// `path` and returns the overlap summary (one line per rank); other ranks return "".
std::string write_profile_trace(const std::string& path, comm::Communicator& world);

}  // namespace hyperpar::train
