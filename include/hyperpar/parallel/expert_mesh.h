#pragma once
// The meshes of an MoE model trained with expert parallel (EP) next to TP and FSDP, built
// from the world mesh (dp_replicate, dp_shard, tp) the way torchtitan does it: EP borrows
// ranks from data parallel, so it needs no ranks of its own.
//
//   expert_tp = 1 (the default): EP borrows from dp_shard * tp. The flattened
//     (dp_shard, tp) dim is unflattened into (efsdp, ep); expert weights are Shard(0) on
//     ["ep"] and FSDP-sharded over the expert-FSDP mesh ["efsdp"] of dp_shard * tp / ep ranks.
//   expert_tp = tp: EP borrows from dp_shard only. dp_shard is unflattened into (efsdp, ep);
//     experts live on the 2-D ["ep", "tp"] mesh (split over tp inside each expert) and are
//     FSDP-sharded over ["efsdp"] of dp_shard / ep ranks.
// With dp_replicate > 1 the expert-FSDP mesh is ["dp_replicate", "efsdp"] (HSDP).
//
// Worked example: 8 ranks, dp_shard 4, tp 2, ep 2 (rank = 2 * dp_shard_coord + tp_coord).
//   expert_tp = 1: (efsdp, ep) over the flattened index r: efsdp = r / 2, ep = r % 2.
//     ep groups {0,1} {2,3} {4,5} {6,7} (here the tp groups), efsdp groups {0,2,4,6} {1,3,5,7}.
//     With 4 experts, rank 5 (ep 1, efsdp 2) owns experts 2..3. Their 2 rows of dim 0 over
//     4 efsdp ranks would be torch.chunk sizes 1,1,0,0 (padded to 4: twice the bytes), so
//     the trainer shards them on dim 1 (parallel::least_padded_dim, as torchtitan does): w1 [4, 64,
//     64] is (Shard(1), Shard(0)) on the combined mesh (efsdp, ep) and rank 5 holds w1[2:4, 32:48,
//     :]. Forced to dim 0 (parallel.expert_shard_dim 0) it is (StridedShard(0, sf=2), Shard(0)) and
//     rank 5 holds none. Each tp rank dispatches half of its data-parallel rank's tokens.
//   expert_tp = 2: dp_shard d = r / 2 splits into efsdp = d / 2, ep = d % 2.
//     ep groups (at one tp coordinate) {0,2} {1,3} {4,6} {5,7}; efsdp groups {0,4} {1,5}
//     {2,6} {3,7}; rank 5's (ep, tp) mesh is {4,5,6,7}; w1's spec on (efsdp, ep, tp):
//     (StridedShard(0, sf=2), Shard(0), Shard(1)).
//
// Gradient scaling: every data-parallel rank's loss is the mean over its own batch, so the
// single-rank gradient of an expert is (sum over all dp ranks' contributions) / dp, with
// dp = dp_replicate * dp_shard. An expert's contributions are spread over the ranks of its
// expert-FSDP mesh, so its gradients are summed there (reduce-scatter, HSDP all-reduce) and
// divided by dp once: FSDPOptions::gradient_divide_factor = dp (an average over efsdp would
// be off by dp_shard / efsdp, i.e. ep / tp or ep).
#include <optional>

#include "hyperpar/mesh/device_mesh.h"

namespace hyperpar::parallel {

struct ExpertMeshes {
  mesh::DeviceMesh ep;            // ["ep"] (expert_tp 1) or ["ep", "tp"] (expert_tp = tp)
  mesh::DeviceMesh expert_dp;     // ["efsdp"] or ["dp_replicate", "efsdp"]
  double gradient_divide_factor;  // dp_replicate * dp_shard
};

/// From a world mesh with dims ("dp_replicate", "dp_shard", "tp"); `ep` must divide
/// dp_shard * tp (expert_tp 1) or dp_shard (expert_tp = tp). Host integers only: works under
/// DeviceContext(meta).
ExpertMeshes make_expert_meshes(const mesh::DeviceMesh& world_mesh, int64_t ep, int64_t expert_tp);

}  // namespace hyperpar::parallel
