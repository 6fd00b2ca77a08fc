#pragma once
// Writing a hyperpar checkpoint (DIR/step-N, checkpoint.h) as a Hugging Face model directory
// that transformers' from_pretrained loads: config.json (hf_config.h: LlamaForCausalLM or
// MixtralForCausalLM) and the weights under HF's names (hf_names.h: q/k rows reordered to
// HF's rotary convention, Mixtral experts split per expert). Weights go to model.safetensors,
// or, when they exceed max_shard_bytes, to model-0000K-of-0000N.safetensors with
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}), as
// save_pretrained shards them. The checkpoint is verified against its manifest first;
// optimizer state is not exported. One process; it holds one tensor and one output shard at a
// time. The model config comes from the checkpoint's hyperpar_state.json.
//
//   auto r = checkpoint::export_hf("ckpt/step-20", "hf-out", {});
//   // python: transformers.AutoModelForCausalLM.from_pretrained("hf-out")
#include <cstdint>
#include <string>
#include <vector>

#include "hyperpar/models/transformer.h"

namespace hyperpar::checkpoint {

struct HFExportOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;  // like save_pretrained's default of 5 GB
  std::string dtype = "float32";               // float32 | bfloat16
  bool overwrite = false;  // replace an earlier export in a non-empty output directory
};

struct HFExportResult {
  std::string architecture;
  std::vector<std::string> files;  // weight files written (names in the output directory)
  int64_t tensors = 0, bytes = 0;
};

/// The model config a hyperpar checkpoint was saved with (its state, completed from the
/// tensor names for older checkpoints).
models::TransformerConfig checkpoint_model_config(const std::string& step_dir);

/// Throws UsageError for a bad checkpoint, a model no HF architecture matches, or a
/// non-empty output directory (without overwrite).
HFExportResult export_hf(const std::string& step_dir, const std::string& out_dir,
                         const HFExportOptions& o);

}  // namespace hyperpar::checkpoint
