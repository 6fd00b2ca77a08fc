#pragma once
// Checkpoint steps that can fail on some ranks only: every rank learns whether any failed,
// so that all raise instead of some waiting forever in the next collective.
#include <string>

#include "hyperpar/comm/world.h"

namespace hyperpar::checkpoint::detail {

/// Collective: true when every rank passed `ok`. Each rank's own message stays with it.
bool all_ok(comm::World& world, bool ok, const char* what);
/// Element i is true when flag i is true on some rank (one all-reduce).
std::vector<bool> any_rank(comm::World& world, const std::vector<bool>& flags, const char* what);
/// Collective: rank 0's value of `v` on every rank.
int64_t broadcast_from_rank0(comm::World& world, int64_t v);

}  // namespace hyperpar::checkpoint::detail
