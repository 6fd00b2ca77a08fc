// The one list of 1-D transitions. Exactly one must be suitable for every pair of distinct
// placements (tests/dtensor/test_transition_registry.cpp checks it).
#include "hyperpar/core/error.h"
#include "registry_entries.h"

namespace hyperpar::dtensor {

const std::vector<const Transition*>& registered_transitions() {
  static const std::vector<const Transition*> all = {
      &shard_to_replicate(), &strided_shard_to_replicate(),
      &replicate_to_shard(), &partial_to_replicate(),
      &partial_to_shard(),   &replicate_to_partial(),
      &shard_to_shard(),     &via_replicate(),
  };
  return all;
}

const Transition& find_transition(const Placement& from, const Placement& to) {
  const Transition* found = nullptr;
  for (const Transition* t : registered_transitions()) {
    if (!t->suitable(from, to)) continue;
    HP_CHECK(found == nullptr, "redistribute: transitions ", found->name(), " and ", t->name(),
             " both claim ", to_string(from), " -> ", to_string(to));
    found = t;
  }
  HP_CHECK(found != nullptr, "redistribute: no transition from ", to_string(from), " to ",
           to_string(to));
  return *found;
}

}  // namespace hyperpar::dtensor
