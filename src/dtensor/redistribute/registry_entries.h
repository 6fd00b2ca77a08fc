#pragma once
// One accessor per transition file; registry.cpp orders them.
#include "hyperpar/dtensor/redistribute/transition.h"

namespace hyperpar::dtensor {
const Transition& shard_to_replicate();
const Transition& strided_shard_to_replicate();
const Transition& replicate_to_shard();
const Transition& partial_to_replicate();
const Transition& partial_to_shard();
const Transition& replicate_to_partial();
const Transition& shard_to_shard();
const Transition& via_replicate();
}  // namespace hyperpar::dtensor
