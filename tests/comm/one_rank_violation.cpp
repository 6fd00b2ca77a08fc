// Test program: only rank 3 hands a transposed view to all_reduce. Rank 3 must raise a
// ContractError at once; the other ranks, already waiting in the collective, must be torn
// down by the launcher rather than hang (checked by test_one_rank_violation.sh).
#include <ATen/ATen.h>

#include <iostream>

#include "hyperpar/comm/run_main.h"
#include "hyperpar/comm/world.h"
#include "hyperpar/core/error.h"
#include "hyperpar/mesh/device_mesh.h"

int main() {
  using namespace hyperpar;
  return comm::run_main([] {
    auto world = comm::World::from_env();
    auto m = mesh::DeviceMesh::init(world, {world->size()}, {"dp"});
    at::Tensor t = at::ones({4, 4});
    at::Tensor arg = world->rank() == 3 ? t.t() : t;
    m.get_group(0)->all_reduce(arg, comm::ReduceOp::kSum, {"layers.3.w2.weight", false});
    std::cout << "rank " << world->rank() << " finished the all_reduce\n";
    return 0;
  });
}
