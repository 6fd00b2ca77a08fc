#include "hyperpar/train/parallel_model.h"

#include <ATen/core/grad_mode.h>

#include <numeric>

#include "hyperpar/core/device_context.h"
#include "hyperpar/parallel/expert_mesh.h"
#include "hyperpar/parallel/expert_parallel.h"
#include "hyperpar/parallel/loss_parallel.h"
#include "hyperpar/parallel/pipeline/stage_split.h"
#include "hyperpar/parallel/tensor_parallel.h"

namespace hyperpar::train {

namespace {

// The plan entries that match a module of this part (a pipeline stage may hold no
// embedding, no head, no dense or no MoE layer).
parallel::ParallelizePlan plan_for(nn::Module& m, const parallel::ParallelizePlan& plan) {
  const auto modules = m.named_modules();
  parallel::ParallelizePlan kept;
  for (const auto& entry : plan)
    for (const auto& [fqn, mod] : modules)
      if (parallel::fqn_matches(entry.first, fqn)) {
        kept.push_back(entry);
        break;
      }
  return kept;
}

}  // namespace

ParallelModel build_parallel_model(const Config& c, std::shared_ptr<comm::World> world,
                                   bool materialize) {
  const auto& p = c.parallel;
  ParallelModel pm;
  std::optional<DeviceContext> meta;
  if (p.init_on_meta || !materialize) meta.emplace(c10::kMeta);
  // Every mesh creation and slice below happens under the meta context (invariant 1).
  models::ModelPart part;
  if (p.pp > 1) {
    // pp outermost: pipeline rank c holds ranks [c S, (c + 1) S), S = dp_replicate*dp_shard*tp,
    // and each stage's ranks form the (dp_replicate, dp_shard, tp) mesh used below.
    const mesh::DeviceMesh full = mesh::DeviceMesh::init(
        world, {p.pp, p.dp_replicate, p.dp_shard, p.tp}, {"pp", "dp_replicate", "dp_shard", "tp"});
    pm.pp_mesh = full["pp"];
    pm.pp_rank = pm.pp_mesh->get_local_rank(0);
    const int64_t per_stage = p.dp_replicate * p.dp_shard * p.tp;
    std::vector<int64_t> ranks(per_stage);
    std::iota(ranks.begin(), ranks.end(), pm.pp_rank * per_stage);
    pm.world_mesh = mesh::DeviceMesh::from_ranks(world, {p.dp_replicate, p.dp_shard, p.tp}, ranks,
                                                 {"dp_replicate", "dp_shard", "tp"});
    const auto spec = pipeline_spec(c);
    pm.stage_layers = parallel::pipeline::split_layers(c.model.n_layers, spec.stages(), p.pp_split);
    part.layers = parallel::pipeline::layers_of_rank(pm.stage_layers, pm.pp_rank, p.pp);
    part.embedding = pm.pp_rank == 0;
    part.head = parallel::pipeline::rank_of_stage(spec.stages() - 1, p.pp) == pm.pp_rank;
  } else {
    pm.world_mesh = mesh::DeviceMesh::init(world, {p.dp_replicate, p.dp_shard, p.tp},
                                           {"dp_replicate", "dp_shard", "tp"});
  }
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
  pm.model = std::make_shared<models::Transformer>(c.model, part);
  auto& m = *pm.model;
  parallel::apply_activation_checkpoint(m, p.activation_checkpoint);
  bool part_has_moe = false, part_has_dense = false;
  for (auto& block : m.layers) (block->moe ? part_has_moe : part_has_dense) = true;
  if (ep && part_has_moe) {
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
        plan_for(m, parallel::transformer_tp_plan(c.model.n_heads, c.model.n_kv_heads,
                                                  part_has_dense, part_has_moe,
                                                  c.model.shared_expert, p.tp, p.sequence_parallel,
                                                  /*moe_experts=*/!ep, p.loss_parallel)));
  pm.logits_split_over_vocab = p.tp > 1 && p.loss_parallel && m.output != nullptr;
  parallel::FSDPOptions fo;
  fo.reshard_after_forward = p.reshard_after_forward;
  fo.reshard_to = p.reshard_to;
  fo.collectives = p.fsdp_collectives;
  fo.host_shared_params = p.fsdp_host_shared;
  fo.param_dtype = p.param_dtype;
  fo.reduce_dtype = p.reduce_dtype;
  // Each parameter on the dim that pads least (dim 0 whenever it divides): a router [4, dim]
  // or experts [4, ...] on 8 ranks would otherwise move twice their bytes.
  const int64_t dp_shard = pm.dp_mesh->size(pm.dp_mesh->ndim() - 1);
  fo.shard_placement_fn = [dp_shard](const std::string&, const nn::Parameter& w) {
    return std::optional<int64_t>(parallel::least_padded_dim(w.data.sizes().vec(), dp_shard));
  };
  parallel::FSDPOptions expert_fo = fo;
  if (ep) {
    expert_fo.gradient_divide_factor = em->gradient_divide_factor;
    // The expert-FSDP group may be smaller than dp_shard: the largest divisor of it that
    // also divides the requested post-forward group.
    const int64_t efsdp = em->expert_dp.size(em->expert_dp.ndim() - 1);
    if (p.reshard_to > 0) expert_fo.reshard_to = std::gcd(p.reshard_to, efsdp);
    // Experts that do not divide over the expert-FSDP ranks go on dim 1 (torchtitan), or
    // where parallel.expert_shard_dim says.
    const int64_t dim = p.expert_shard_dim;
    expert_fo.shard_placement_fn = [dim, efsdp](const std::string&, const nn::Parameter& w) {
      return std::optional<int64_t>(
          dim >= 0 ? dim : parallel::least_padded_dim(w.data.sizes().vec(), efsdp));
    };
  }
  // Kept unsharded after forward: the root (embeddings, norm, output), as FSDP2 does for its
  // root, and the last block, as torchtitan does: backward needs both right after forward,
  // so resharding them would cost an all-gather each for nothing.
  parallel::FSDPOptions kept = fo, expert_kept = expert_fo;
  if (!p.reshard_root_and_last)
    kept.reshard_after_forward = expert_kept.reshard_after_forward = false;
  // Prefetch chains. Forward unshards: root (embeddings), then block l and, inside it, its
  // experts, for l = 0..L-1. Backward refills: root (the loss side), then block l and its
  // experts for l = L-1..0. Each group prefetches the next one of its chain.
  std::vector<std::vector<parallel::FSDPHandle>> blocks(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const std::string prefix = "layers." + std::to_string(m.layer_ids[l]) + ".";
    // Expert FSDP first (its own group on the expert-FSDP mesh), then the block.
    std::optional<parallel::FSDPHandle> experts;
    if (ep && m.layers[l]->moe)
      experts =
          parallel::fully_shard(*m.layers[l]->moe->experts, *pm.expert_dp_mesh,
                                m.layer_ids[l] == c.model.n_layers - 1 ? expert_kept : expert_fo,
                                prefix + "moe.experts.");
    const bool last = m.layer_ids[l] == c.model.n_layers - 1;
    pm.fsdp.push_back(parallel::fully_shard(*m.layers[l], *pm.dp_mesh, last ? kept : fo, prefix));
    blocks[l].push_back(pm.fsdp.back());
    if (experts) {
      pm.fsdp.push_back(*experts);
      blocks[l].push_back(*experts);
    }
  }
  pm.fsdp.push_back(parallel::fully_shard(m, *pm.dp_mesh, kept));
  if (p.pp > 1) {
    // Under a pipeline schedule the stages' groups are unsharded explicitly, once per step.
    pm.stage_groups.resize(pm.stage_layers.size());
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const int64_t l = m.layer_ids[i];
      for (size_t s = 0; s < pm.stage_layers.size(); ++s)
        if (l >= pm.stage_layers[s].first && l < pm.stage_layers[s].end)
          pm.stage_groups[s].insert(pm.stage_groups[s].end(), blocks[i].begin(), blocks[i].end());
    }
    for (size_t s = 0; s < pm.stage_layers.size(); ++s)
      if ((pm.stage_layers[s].embedding && part.embedding) ||
          (pm.stage_layers[s].head && part.head))
        pm.stage_groups[s].push_back(pm.fsdp.back());
  } else if (p.prefetch) {
    std::vector<parallel::FSDPHandle> fwd{pm.fsdp.back()}, bwd{pm.fsdp.back()};
    for (auto& b : blocks) fwd.insert(fwd.end(), b.begin(), b.end());
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
      bwd.insert(bwd.end(), it->begin(), it->end());
    for (size_t i = 0; i + 1 < fwd.size(); ++i)
      fwd[i].set_modules_to_forward_prefetch({fwd[i + 1]});
    for (size_t i = 0; i + 1 < bwd.size(); ++i)
      bwd[i].set_modules_to_backward_prefetch({bwd[i + 1]});
  }
  meta.reset();
  if (materialize) {
    if (p.init_on_meta) m.to_empty(c10::kCPU);
    m.init_weights(c.train.seed);
  }
  return pm;
}

at::Tensor cross_entropy(const ParallelModel& pm, const at::Tensor& logits,
                         const at::Tensor& targets) {
  if (!pm.logits_split_over_vocab) return models::Transformer::loss(logits, targets);
  return parallel::vocab_parallel_cross_entropy(logits, targets, *pm.tp_mesh,
                                                pm.model->cfg.vocab_size);
}

at::Tensor whole_logits(const ParallelModel& pm, const at::Tensor& logits) {
  at::NoGradGuard no_grad;
  if (!pm.logits_split_over_vocab) return logits.detach();
  return parallel::relayout(logits.detach(), *pm.tp_mesh, dtensor::Shard{-1}, dtensor::Replicate{},
                            std::nullopt, "output gather");
}

}  // namespace hyperpar::train
