#pragma once
// Transition: one 1-D resharding step on one mesh dim (from one placement to another), with
// the other mesh dims' placements unchanged. Each transition is a small class in its own
// file under src/dtensor/redistribute/; registry.cpp lists them all, in one place.
//
// The planner only runs a step on mesh dim i when no mesh dim to the right of i shards the
// tensor dims involved, so along those dims the calling rank's local block is exactly its
// part of the "parent" block (what the mesh dims left of i leave), of `extent(d)` items.
// Buffers handed to collectives are contiguous by construction, and results are contiguous.
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hyperpar/comm/communicator.h"
#include "hyperpar/dtensor/placement.h"

namespace hyperpar::dtensor {

struct StepContext {
  std::shared_ptr<comm::Communicator> group;  // the mesh dim's group (size 1 allowed)
  int64_t size;                               // group size
  int64_t coord;                              // calling rank's coordinate on the mesh dim
  std::function<int64_t(int64_t)> extent;     // parent extent of a tensor dim
  std::string tag;                            // passed to every collective
};

class Transition {
 public:
  virtual ~Transition() = default;
  virtual const char* name() const = 0;
  virtual bool suitable(const Placement& from, const Placement& to) const = 0;
  virtual at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement& to,
                           const StepContext& ctx) const = 0;
};

/// Every registered transition, in registry order.
const std::vector<const Transition*>& registered_transitions();
/// The one transition suitable for from -> to (from != to); throws if none or several.
const Transition& find_transition(const Placement& from, const Placement& to);

}  // namespace hyperpar::dtensor
