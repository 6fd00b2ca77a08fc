#pragma once
// Redistribution planner: reduces an N-D redistribution to 1-D steps, one mesh dim each.
//
// Rule: a step on mesh dim i is run only when no mesh dim right of i shards the tensor dims
// it touches (then the local block along them is exactly this rank's part of its parent).
//   1. Right to left, every mesh dim whose placement changes and whose step is safe runs
//      its direct transition.
//   2. If placements still differ, from the first differing mesh dim m: dims n-1..m go to
//      Replicate (right to left, always safe), then m..n-1 go to their targets (left to
//      right, always safe).
// Example, (2,4) mesh: (Shard 0, Shard 1) -> (Shard 0, Replicate) is one all-gather on "tp";
// (Shard 0, Shard 0) -> (Replicate, Shard 0) gathers tp, gathers dp, then chunks on tp.
//
// Plans are cached by value: (mesh, source placements, target placements, global shape).
#include <memory>
#include <vector>

#include "hyperpar/dtensor/dtensor_spec.h"
#include "hyperpar/dtensor/redistribute/transition.h"

namespace hyperpar::dtensor {

struct RedistributeStep {
  int64_t mesh_dim;
  Placement from, to;
  Placements before;  // all placements before this step
  const Transition* transition;
};

struct RedistributePlan {
  std::vector<RedistributeStep> steps;
};

/// The (cached) plan from `src` to `dst_placements` on the same mesh and shape.
std::shared_ptr<const RedistributePlan> plan_redistribute(const DTensorSpec& src,
                                                          const Placements& dst_placements);
/// Number of plans computed (cache misses) so far, for tests.
size_t redistribute_plans_computed();

}  // namespace hyperpar::dtensor
