#pragma once
// Builds the model of a Config on a world, the way the reported path does: meshes, model
// under DeviceContext(meta) (when init_on_meta), tensor parallel, fully_shard per block and
// on the root, all inside that context; then to_empty(cpu) + init_weights(seed).
//
// Mesh (torchtitan's): dims (dp_replicate, dp_shard, tp), row-major over the ranks; the FSDP
// mesh is ["dp_shard"] (or ["dp_replicate", "dp_shard"] for HSDP), TP is ["tp"].
// 8 ranks, tp=2, dp_replicate=1: dp_shard = 8 / 2 = 4; rank 5 has coordinate (0, 2, 1):
// tp group {4, 5}, dp_shard group {1, 3, 5, 7}.
// With ep > 1 (MoE models), EP borrows ranks from data parallel: the ep and expert-FSDP
// meshes of parallel/expert_mesh.h (worked 8-rank example there). Each MoE's experts get
// their own fully_shard group on the expert-FSDP mesh before their block's.
// With pp > 1 the world mesh is (pp, dp_replicate, dp_shard, tp), pp outermost: 8 ranks,
// pp=2, tp=2: pipeline rank 1 holds ranks 4..7; rank 5's pipeline is {1, 5}, its tp group
// {4, 5}, its dp_shard group {5, 7}. Each rank builds only the modules of its stages
// (parallel/pipeline/stage_split.h), under their whole-model names, and the trainer runs
// them with parallel/pipeline/pipeline_runtime.h.
#include <memory>
#include <optional>
#include <vector>

#include "hyperpar/models/transformer.h"
#include "hyperpar/parallel/fsdp.h"
#include "hyperpar/parallel/pipeline/stage_split.h"
#include "hyperpar/train/config.h"

namespace hyperpar::train {

struct ParallelModel {
  std::shared_ptr<models::Transformer> model;  // with pp > 1: this rank's stages only
  /// The (dp_replicate, dp_shard, tp) mesh: of the whole world, or with pp > 1 of this
  /// rank's pipeline stage (the ranks [c S, (c + 1) S) of pipeline rank c, S = world / pp).
  std::optional<mesh::DeviceMesh> world_mesh, dp_mesh, tp_mesh;
  std::optional<mesh::DeviceMesh> pp_mesh;  // pp > 1: this rank's pipeline (dim "pp")
  int64_t pp_rank = 0;
  std::vector<parallel::pipeline::StageLayers> stage_layers;  // pp > 1: every stage's
  /// pp > 1: per global stage, the FSDP groups of its modules on this rank (empty for the
  /// stages of other pipeline ranks).
  std::vector<std::vector<parallel::FSDPHandle>> stage_groups;
  std::optional<mesh::DeviceMesh> ep_mesh, expert_dp_mesh;  // set when ep > 1
  std::vector<parallel::FSDPHandle> fsdp;
  int64_t dp_rank = 0, dp_size = 1;  // this rank's data-parallel index and the dp degree
  /// Loss parallel: the model's logits are this rank's chunk of the vocabulary on tp_mesh.
  bool logits_split_over_vocab = false;
};

/// Mean cross entropy of this rank's model output `logits` against `targets`: whole logits
/// through models::Transformer::loss, logits split over the vocabulary through
/// parallel::vocab_parallel_cross_entropy (a collective over the tp mesh).
at::Tensor cross_entropy(const ParallelModel& pm, const at::Tensor& logits,
                         const at::Tensor& targets);

/// The whole logits from this rank's model output (gathered over tp when split; collective
/// then), without gradient.
at::Tensor whole_logits(const ParallelModel& pm, const at::Tensor& logits);

/// `materialize` false leaves parameters on meta (dry run).
ParallelModel build_parallel_model(const Config& c, std::shared_ptr<comm::World> world,
                                   bool materialize = true);

}  // namespace hyperpar::train
