#pragma once
// Distributed checkpoints in PyTorch DCP's Hugging Face safetensors layout
// (torch.distributed.checkpoint.HuggingFaceStorageWriter/Reader), so that either side reads
// what the other wrote, resharded to any layout and world size.
//
// A checkpoint is a directory DIR/step-N:
//   rank-RRRRR-part-K.safetensors  the K-th box of every tensor rank R writes; each file's
//                                  __metadata__["DCP_SHARDING_INFO"] = JSON
//                                  {fqn: {"saved_offsets": [...]}} places each tensor as a
//                                  box of the global tensor (a shard that is not one box,
//                                  e.g. StridedShard under FSDP x TP, is several boxes in
//                                  several files, since a file holds a key once)
//   model.safetensors.index.json   {"weight_map": {fqn: first file holding it}}
//   hyperpar_state.json            non-tensor state (step, optimizer steps, config, layout)
//   manifest.json                  every file's size and XXH64 (manifest.h)
// Keys: parameters by FQN; optimizer state as optimizer.<state>.<fqn>, e.g.
// optimizer.exp_avg.layers.0.attention.wq.weight (AdamW: exp_avg, exp_avg_sq; SGD:
// momentum_buffer). Replicated data is written once, by the replica at coordinate 0
// (boxes.h). No rank gathers a full tensor, on save or on load.
//
// save() is atomic: files go to DIR/step-N.tmp-<id>/ (fsync'ed), every rank finishes, then
// rank 0 writes the manifest and renames the directory to DIR/step-N (fsync'ed); a crash at
// any point leaves the previous complete checkpoint as it was. keep = K deletes older
// complete checkpoints beyond the newest K (never the newest).
// A directory without manifest.json whose *.safetensors carry DCP_SHARDING_INFO (or whole
// tensors), as PyTorch's HuggingFaceStorageWriter writes it, loads too (unverified).
// load() verifies the manifest (split over the ranks), checks names and shapes, then each
// rank reads, through mmap, only the saved boxes that intersect its own, straight into its
// local tensors. Errors are UsageErrors (exit 2) raised on every rank; nothing is written.
//
//   auto shards = checkpoint::collect_shards(model, &optimizer, world.rank());
//   checkpoint::save("ckpt", 10, shards, state_json, world, checkpoint::SaveOptions{2});
//   auto r = checkpoint::load(checkpoint::latest_complete("ckpt"), shards, world);
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hyperpar/comm/world.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/nn/module.h"
#include "hyperpar/optim/optimizer.h"

namespace hyperpar::checkpoint {

/// One tensor of a checkpoint as this rank holds it.
struct TensorShard {
  std::string fqn;
  at::Tensor local;  // this rank's data (written/read in place)
  std::vector<int64_t> global_shape;
  std::vector<dtensor::IndexRanges> ranges;  // global index ranges of `local`, per dim
  bool writer = true;                        // this rank writes these boxes (one per replica)
};

/// The model's parameters (by FQN) and the optimizer's state (optimizer.<state>.<fqn>).
std::vector<TensorShard> collect_shards(nn::Module& model, optim::Optimizer* opt,
                                        int64_t global_rank);

struct SaveOptions {
  int64_t keep = 0;  // keep the newest K complete checkpoints (0: all)
};
/// Collective over every rank of `world`; returns DIR/step-N.
std::string save(const std::string& dir, int64_t step, const std::vector<TensorShard>& shards,
                 const std::string& state_json, comm::World& world, const SaveOptions& o = {});

struct LoadOptions {
  bool strict = true;  // false: optimizer state missing from the checkpoint is allowed
};
struct LoadResult {
  std::string state_json;
  std::vector<std::string> missing_allowed;  // optimizer state not found (strict = false)
  bool foreign = false;  // no manifest (written by PyTorch): not verified, no hyperpar state
};
/// Collective over every rank of `world`.
LoadResult load(const std::string& path, const std::vector<TensorShard>& shards, comm::World& world,
                const LoadOptions& o = {});

/// The newest complete checkpoint (DIR/step-N with a manifest) in `dir`; "" when none.
std::string latest_complete(const std::string& dir);
/// N of a .../step-N path (-1 when it is not one).
int64_t step_of(const std::string& path);

}  // namespace hyperpar::checkpoint
