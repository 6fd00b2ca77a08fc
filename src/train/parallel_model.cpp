#include "hyperpar/train/parallel_model.h"

#include "hyperpar/core/device_context.h"
#include "hyperpar/parallel/expert_mesh.h"
#include "hyperpar/parallel/expert_parallel.h"
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
  const bool has_moe = !c.model.moe_layers.empty() && c.model.n_experts > 0;
  const bool ep = p.ep > 1 && has_moe;
  std::optional<parallel::ExpertMeshes> em;
  if (ep) {
    em = parallel::make_expert_meshes(*pm.world_mesh, p.ep, p.expert_tp);
    pm.ep_mesh = em->ep;
    pm.expert_dp_mesh = em->expert_dp;
  }
  pm.model = std::make_shared<models::Transformer>(c.model);
  auto& m = *pm.model;
  if (ep) {
    // Experts first (Shard(0) on ep, or (Shard(0), hidden split) on (ep, tp)); the TP plan
    // below then leaves them alone.
    std::optional<mesh::DeviceMesh> split;
    if (p.expert_tp == 1 && p.tp > 1) split = pm.tp_mesh;
    parallel::apply_plan(m, em->ep,
                         {{"layers.*.moe", std::make_shared<parallel::ExpertParallel>(
                                               split, p.sequence_parallel && p.tp > 1)}});
  }
  if (p.tp > 1)
    parallel::parallelize_module(
        m, *pm.tp_mesh,
        parallel::transformer_tp_plan(
            c.model.n_heads, c.model.n_kv_heads,
            static_cast<int64_t>(c.model.moe_layers.size()) < c.model.n_layers, has_moe,
            c.model.shared_expert, p.tp, p.sequence_parallel, /*moe_experts=*/!ep));
  parallel::FSDPOptions fo{p.reshard_after_forward, p.param_dtype, p.reduce_dtype, std::nullopt};
  parallel::FSDPOptions expert_fo = fo;
  if (ep) expert_fo.gradient_divide_factor = em->gradient_divide_factor;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    // Expert FSDP first (its own group on the expert-FSDP mesh), then the block.
    if (ep && m.layers[l]->moe)
      pm.fsdp.push_back(parallel::fully_shard(*m.layers[l]->moe->experts, *pm.expert_dp_mesh,
                                              expert_fo, prefix + "moe.experts."));
    pm.fsdp.push_back(parallel::fully_shard(*m.layers[l], *pm.dp_mesh, fo, prefix));
  }
  pm.fsdp.push_back(parallel::fully_shard(m, *pm.dp_mesh, fo));
  meta.reset();
  if (materialize) {
    if (p.init_on_meta) m.to_empty(c10::kCPU);
    m.init_weights(c.train.seed);
  }
  return pm;
}

}  // namespace hyperpar::train
