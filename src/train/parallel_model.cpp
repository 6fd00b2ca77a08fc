#include "hyperpar/train/parallel_model.h"

#include "hyperpar/core/device_context.h"
#include "hyperpar/parallel/tensor_parallel.h"

namespace hyperpar::train {

ParallelModel build_parallel_model(const Config& c, std::shared_ptr<comm::World> world,
                                   bool materialize) {
  const auto& p = c.parallel;
  ParallelModel pm;
  std::optional<DeviceContext> meta;
  if (p.init_on_meta || !materialize) meta.emplace(c10::kMeta);
  // Every mesh creation and slice below happens under the meta context (invariant 1).
  pm.world_mesh = mesh::DeviceMesh::init(world, {p.dp_replicate, p.dp_shard, p.tp},
                                         {"dp_replicate", "dp_shard", "tp"});
  pm.tp_mesh = (*pm.world_mesh)["tp"];
  pm.dp_mesh = p.dp_replicate > 1 ? pm.world_mesh->slice({"dp_replicate", "dp_shard"})
                                  : (*pm.world_mesh)["dp_shard"];
  const auto coord = *pm.world_mesh->get_coordinate();
  pm.dp_rank = coord[0] * p.dp_shard + coord[1];
  pm.dp_size = p.dp_replicate * p.dp_shard;
  pm.model = std::make_shared<models::Transformer>(c.model);
  auto& m = *pm.model;
  if (p.tp > 1)
    parallel::parallelize_module(
        m, *pm.tp_mesh,
        parallel::transformer_tp_plan(
            c.model.n_heads, c.model.n_kv_heads,
            static_cast<int64_t>(c.model.moe_layers.size()) < c.model.n_layers,
            !c.model.moe_layers.empty() && c.model.n_experts > 0, c.model.shared_expert, p.tp,
            p.sequence_parallel));
  parallel::FSDPOptions fo{p.reshard_after_forward, p.param_dtype, p.reduce_dtype};
  for (size_t l = 0; l < m.layers.size(); ++l)
    pm.fsdp.push_back(
        parallel::fully_shard(*m.layers[l], *pm.dp_mesh, fo, "layers." + std::to_string(l) + "."));
  pm.fsdp.push_back(parallel::fully_shard(m, *pm.dp_mesh, fo));
  meta.reset();
  if (materialize) {
    if (p.init_on_meta) m.to_empty(c10::kCPU);
    m.init_weights(c.train.seed);
  }
  return pm;
}

}  // namespace hyperpar::train
