#include "hyperpar/parallel/expert_mesh.h"

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/shard_math.h"

namespace hyperpar::parallel {

int64_t expert_fsdp_shard_dim(const std::vector<int64_t>& ep_local_shape, int64_t efsdp) {
  HP_CHECK(!ep_local_shape.empty() && efsdp >= 1, "expert_fsdp_shard_dim: expected a shape and ",
           "an expert-FSDP size >= 1, got ", ep_local_shape.size(), " dims over ", efsdp);
  if (ep_local_shape[0] % efsdp == 0 || ep_local_shape.size() < 2) return 0;
  // Elements moved per rank set when sharding dim d: every rank's segment holds the largest
  // torch.chunk part of it (the dims past 1 are a common factor, left out).
  const int64_t e = ep_local_shape[0], rows = ep_local_shape[1];
  const int64_t p0 = dtensor::max_chunk_size(e, efsdp) * efsdp * rows;
  const int64_t p1 = dtensor::max_chunk_size(rows, efsdp) * efsdp * e;
  return p1 < p0 ? 1 : 0;
}

ExpertMeshes make_expert_meshes(const mesh::DeviceMesh& world_mesh, int64_t ep, int64_t expert_tp) {
  HP_CHECK(world_mesh.dim_names() == (std::vector<std::string>{"dp_replicate", "dp_shard", "tp"}),
           "make_expert_meshes: expected a (dp_replicate, dp_shard, tp) world mesh, got ",
           world_mesh.to_string());
  const int64_t dp_replicate = world_mesh.size(0), dp_shard = world_mesh.size(1),
                tp = world_mesh.size(2);
  HP_CHECK(ep >= 1, "make_expert_meshes: ep must be >= 1, got ", ep);
  HP_CHECK(expert_tp == 1 || expert_tp == tp, "make_expert_meshes: expert_tp must be 1 or tp (", tp,
           "), got ", expert_tp);
  std::optional<mesh::DeviceMesh> ep_mesh;
  if (expert_tp == 1) {
    const int64_t borrowed = dp_shard * tp;
    HP_CHECK(borrowed % ep == 0, "expert parallel: ep ", ep,
             " must divide dp_shard*tp = ", borrowed, " (ep borrows its ranks from them)");
    world_mesh.slice({"dp_shard", "tp"})
        .flatten("dp_shard_tp")
        .unflatten(0, {borrowed / ep, ep}, {"efsdp", "ep"});
    ep_mesh = world_mesh["ep"];
  } else {
    HP_CHECK(dp_shard % ep == 0, "expert parallel: ep ", ep, " must divide dp_shard = ", dp_shard,
             " when experts are also split over tp (expert_tp = tp)");
    world_mesh["dp_shard"].unflatten(0, {dp_shard / ep, ep}, {"efsdp", "ep"});
    ep_mesh = world_mesh.slice({"ep", "tp"});
  }
  mesh::DeviceMesh expert_dp =
      dp_replicate > 1 ? world_mesh.slice({"dp_replicate", "efsdp"}) : world_mesh["efsdp"];
  return {*ep_mesh, expert_dp, static_cast<double>(dp_replicate * dp_shard)};
}

}  // namespace hyperpar::parallel
