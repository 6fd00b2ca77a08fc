#include "hyperpar/core/error.h"
#include "hyperpar/parallel/tensor_parallel.h"

namespace hyperpar::parallel {

using namespace dtensor;

ParallelizePlan transformer_tp_plan(int64_t n_heads, int64_t n_kv_heads, bool has_dense,
                                    bool has_moe, bool shared_expert, int64_t tp, bool sp,
                                    bool moe_experts, bool loss_parallel) {
  HP_CHECK(n_heads % tp == 0 && n_kv_heads % tp == 0, "tensor parallel: n_heads ", n_heads,
           " and n_kv_heads ", n_kv_heads, " must both be divisible by tp ", tp);
  const Placement act = sp ? Placement{Shard{1}} : Placement{Replicate{}};
  auto colwise_prepared = std::make_shared<ColwiseParallel>(std::nullopt);
  auto rowwise = std::make_shared<RowwiseParallel>(Shard{-1}, act);
  auto prepare = std::make_shared<PrepareModuleInput>(act, Replicate{});
  ParallelizePlan plan = {
      {"tok_embeddings", std::make_shared<RowwiseParallel>(Replicate{}, act)},
      {"layers.*.attention", prepare},
      {"layers.*.attention.wq", colwise_prepared},
      {"layers.*.attention.wk", colwise_prepared},
      {"layers.*.attention.wv", colwise_prepared},
      {"layers.*.attention.wo", rowwise},
      {"output", std::make_shared<ColwiseParallel>(
                     act, loss_parallel ? Placement{Shard{-1}} : Placement{Replicate{}})},
  };
  if (sp)
    for (const char* n : {"layers.*.attention_norm", "layers.*.ffn_norm", "norm"})
      plan.push_back({n, std::make_shared<SequenceParallel>()});
  if (has_dense) {
    plan.push_back({"layers.*.feed_forward", prepare});
    for (const char* n : {"layers.*.feed_forward.w1", "layers.*.feed_forward.w3"})
      plan.push_back({n, colwise_prepared});
    plan.push_back({"layers.*.feed_forward.w2", rowwise});
  }
  if (has_moe) {
    if (sp) {
      // Whole MoE input gathered once (gradient reduce-scattered); output back to Shard(1).
      plan.push_back({"layers.*.moe", std::make_shared<PrepareModuleInput>(act, Replicate{})});
      plan.push_back({"layers.*.moe", std::make_shared<PrepareModuleOutput>(Replicate{}, act)});
    }
    if (moe_experts) plan.push_back({"layers.*.moe", std::make_shared<MoETensorParallel>(sp)});
    if (shared_expert) {
      if (!sp)
        plan.push_back({"layers.*.moe.shared_expert",
                        std::make_shared<PrepareModuleInput>(Replicate{}, Replicate{})});
      for (const char* n : {"layers.*.moe.shared_expert.w1", "layers.*.moe.shared_expert.w3"})
        plan.push_back({n, colwise_prepared});
      plan.push_back({"layers.*.moe.shared_expert.w2",
                      std::make_shared<RowwiseParallel>(Shard{-1}, Replicate{})});
    }
  }
  return plan;
}

}  // namespace hyperpar::parallel
