#pragma once
// Runs a schedule (lowering.h) in one process on a simulated world of pp ranks, with unit
// costs, to check it and to measure its bubble.
//
// Checks: every action runs on the rank that holds its stage; each (stage, microbatch) has
// exactly one F and one B (or one I and one W), F before B (I before W); every SEND has its
// RECV on the receiving rank and every RECV its SEND; FSDP actions (when present) are one
// UNSHARD before the stage's first compute, one REDUCE_GRAD after its last weight gradient
// and one RESHARD after its last compute. Then each rank executes its list in order: a
// compute waits for its inputs (the previous stage's F, the next stage's B), a RECV for its
// SEND (sends never wait); if no rank can move and some are not done, the schedule
// deadlocks and the waiting actions are named.
// Timing: F costs 1, B 2, I 1, W 1 (backward ~ twice forward), communication 0. The bubble
// fraction is 1 - (busy time of all ranks) / (pp x makespan).
//
//   auto r = simulate(lowered_schedule(spec, true), spec);
//   if (!r.ok()) for (auto& p : r.problems) std::cerr << p << "\n";
#include <string>
#include <vector>

#include "hyperpar/parallel/pipeline/lowering.h"

namespace hyperpar::parallel::pipeline {

struct SimulationResult {
  std::vector<std::string> problems;  // empty: valid
  int64_t makespan = 0;
  std::vector<int64_t> busy;  // per rank
  double bubble_fraction = 0;
  bool ok() const { return problems.empty(); }
};

SimulationResult simulate(const RankActions& actions, const ScheduleSpec& s);

/// One text block for the dry run: each rank's actions and the bubble fraction.
std::string describe_schedule(const RankActions& actions, const ScheduleSpec& s);

}  // namespace hyperpar::parallel::pipeline
