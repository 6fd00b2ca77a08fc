// hyperpar-demo: the main job until the trainer exists. On every rank: builds a (2, W/2)
// ("dp","tp") mesh inside DeviceContext(meta), checks it against one built outside, runs
// each collective on its groups and verifies the values; rank 0 prints a summary.
#include <ATen/ATen.h>

#include <iostream>

#include "hyperpar/comm/run_main.h"
#include "hyperpar/comm/world.h"
#include "hyperpar/core/device_context.h"
#include "hyperpar/core/error.h"
#include "hyperpar/mesh/device_mesh.h"

using namespace hyperpar;

int main() {
  return comm::run_main([] {
    auto world = comm::World::from_env();
    const int64_t W = world->size();
    HP_CHECK(W % 2 == 0, "the demo needs an even number of workers, got ", W);
    auto outside = mesh::DeviceMesh::init(world, {2, W / 2}, {"dp", "tp"});
    std::optional<mesh::DeviceMesh> inside;
    {
      DeviceContext meta(c10::kMeta);
      inside = mesh::DeviceMesh::init(world, {2, W / 2}, {"dp", "tp"});
      HP_CHECK(*inside == outside && (*inside)["tp"] == outside["tp"] &&
                   inside->flatten() == outside.flatten(),
               "mesh built under meta differs");
    }
    auto tp = outside.get_group("tp");
    auto dp = outside.get_group("dp");
    at::Tensor x = at::full({4}, static_cast<double>(world->rank()), at::kFloat);
    tp->all_reduce(x, comm::ReduceOp::kSum);
    at::Tensor gathered = at::empty({4 * dp->size()}, at::kFloat);
    dp->all_gather_into_tensor(gathered, x);
    double tp_sum = 0;
    for (int64_t r : tp->ranks()) tp_sum += r;
    HP_CHECK(x[0].item<double>() == tp_sum, "tp all_reduce gave ", x[0].item<double>());
    if (world->rank() == 0) {
      std::cout << "hyperpar demo: " << W << " ranks, mesh " << outside.to_string() << "\n"
                << "  rank 0 tp group " << tp->label() << ", dp group " << dp->label() << "\n"
                << "  tp all_reduce(sum of ranks) = " << x[0].item<double>()
                << ", dp all_gather = [" << gathered[0].item<double>() << ", "
                << gathered[4].item<double>() << "]\n"
                << "  mesh built under DeviceContext(meta) equals the one built outside: yes\n";
    }
    outside.get_group(0)->barrier();
    return 0;
  });
}
