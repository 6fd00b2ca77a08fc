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
#include <memory>
#include <optional>
#include <vector>

#include "hyperpar/models/transformer.h"
#include "hyperpar/parallel/fsdp.h"
#include "hyperpar/train/config.h"

namespace hyperpar::train {

struct ParallelModel {
  std::shared_ptr<models::Transformer> model;
  std::optional<mesh::DeviceMesh> world_mesh, dp_mesh, tp_mesh;
  std::optional<mesh::DeviceMesh> ep_mesh, expert_dp_mesh;  // set when ep > 1
  std::vector<parallel::FSDPHandle> fsdp;
  int64_t dp_rank = 0, dp_size = 1;  // this rank's data-parallel index and the dp degree
};

/// `materialize` false leaves parameters on meta (dry run).
ParallelModel build_parallel_model(const Config& c, std::shared_ptr<comm::World> world,
                                   bool materialize = true);

}  // namespace hyperpar::train
