#include "hyperpar/parallel/expert_mesh.h"

#include "hyperpar/core/error.h"

namespace hyperpar::parallel {

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
