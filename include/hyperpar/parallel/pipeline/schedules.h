#pragma once
// Pipeline schedules as data: one generator per schedule gives each pipeline rank its
// compute actions (F, B, or I and W) in order; lowering.h adds the communication and FSDP
// actions, simulator.h checks the result.
//
// Stages: pp ranks x v virtual stages = pp v stages, stage s on rank s mod pp ("loop"
// placement, as torchtitan and PyTorch's interleaved schedules place them); rank r holds
// stages r, r + pp, ..., r + (v-1) pp.
//
// Schedules (names as torch.distributed.pipelining's get_schedule_class):
//   GPipe                  v = 1: every forward, then every backward.
//   1F1B                   v = 1: pp - 1 - r forwards (warm-up), then one forward and one
//                          backward in turn, then the remaining backwards.
//   Interleaved1F1B        v >= 1, Megatron's interleaved 1F1B (depth first): microbatches
//                          go in rounds of m / max(1, m / pp); the k-th forward of rank r runs
//                          local stage (k / per_round) mod v, the k-th backward local stage
//                          v - 1 - (k / per_round) mod v; warm-up (v-1) per_round + 2 (pp-1-r)
//                          forwards (at most m v), then forward/backward pairs, then backwards.
//   InterleavedZeroBubble  ZB-H1 generalised to v stages (PyTorch's "ZB1P"): as above with a
//                          warm-up of (v-1) per_round + (pp-1-r), backward split into I (input
//                          gradient, on the critical path) and W (weight gradient); rank r
//                          defers its first r W's and runs one W after each later I, the
//                          deferred ones at the end, filling the bubbles.
// These orders are the ones PyTorch 2.13 builds for the same (pp, v, m) (checked by
// tests/parallel/test_pipeline_schedules.sh against PyTorch itself).
//
//   ScheduleSpec s{ScheduleKind::k1F1B, /*pp=*/4, /*v=*/1, /*m=*/8};
//   compute_schedule(s)[0] -> 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7
#include <string>

#include "hyperpar/parallel/pipeline/action.h"

namespace hyperpar::parallel::pipeline {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kInterleavedZeroBubble };

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int64_t pp = 1, virtual_stages = 1, microbatches = 1;
  int64_t stages() const { return pp * virtual_stages; }
};

/// "GPipe" | "1F1B" | "Interleaved1F1B" | "InterleavedZeroBubble" (also "ZBH1"); throws
/// UsageError naming `key` and the choices.
ScheduleKind parse_schedule(const std::string& name, const std::string& key);
const char* schedule_name(ScheduleKind k);
/// Whether the schedule splits backward into I and W.
bool splits_backward(ScheduleKind k);

/// The rank that runs `stage`.
inline int64_t rank_of_stage(int64_t stage, int64_t pp) { return stage % pp; }

/// Throws UsageError naming the values for combinations no schedule can run: sizes < 1,
/// several virtual stages with a one-stage schedule, microbatches that do not split into
/// rounds, fewer layers than stages (n_layers < 0 skips that check).
void check_schedule(const ScheduleSpec& s, int64_t n_layers = -1);

/// Compute actions per pipeline rank (check_schedule first).
RankActions compute_schedule(const ScheduleSpec& s);

}  // namespace hyperpar::parallel::pipeline
