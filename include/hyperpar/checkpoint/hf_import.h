#pragma once
// Initialising a hyperpar model from a Hugging Face Llama/Mixtral directory (config.json +
// *.safetensors, one file or sharded with model.safetensors.index.json), on any layout.
//
// Every rank maps the files and reads only the boxes of its own shards (the resharded read
// of checkpoint/checkpoint.h): for each box of a local shard, the matching block of the HF
// tensor (names and q/k row order: hf_names.h; for q/k the block is widened to whole heads,
// reordered, then cut back), converted to the parameter's dtype. A Mixtral expert block is
// assembled from the per-expert tensors it covers. Names and shapes are checked first, the
// same way on every rank (missing, mismatched, unexpected tensors are listed; nothing is
// written); read failures are agreed on collectively, so every rank raises.
// With tie_word_embeddings, lm_head is read from embed_tokens (hyperpar then trains the two
// as separate tensors).
//
//   auto hf = checkpoint::read_hf_config("llama-dir");
//   ... build the model from hf.model, shard it, materialise ...
//   checkpoint::load_hf("llama-dir", model, hf, world);
#include <string>

#include "hyperpar/checkpoint/hf_config.h"
#include "hyperpar/comm/world.h"
#include "hyperpar/nn/module.h"

namespace hyperpar::checkpoint {

/// Collective over `world`. Throws UsageError (bad directory, names, shapes) or Error.
void load_hf(const std::string& dir, nn::Module& model, const HFModelConfig& hf,
             comm::World& world);

}  // namespace hyperpar::checkpoint
