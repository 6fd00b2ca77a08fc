#pragma once
// hyperpar-train --export: the full model as one safetensors file written by rank 0, from
// any layout. Every parameter is gathered to its full tensor within its stage's meshes; with
// pipeline parallelism (pp > 1) the first rank of every other stage in rank 0's pipeline then
// sends its stages' full tensors to rank 0 over the pp group, in named_parameters order, and
// rank 0 derives their names and shapes from the config (the same stage split), so nothing
// but the tensors travels.
#include <string>

#include "hyperpar/comm/world.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

/// Collective over every rank of `world`.
void export_full_model(const Config& c, ParallelModel& pm, const std::string& path,
                       comm::World& world);

}  // namespace hyperpar::train
