#pragma once
// Hugging Face transformers' config.json for hyperpar's Transformer (models/transformer.h),
// both ways. Two architectures match hyperpar's exactly:
//   dense                               -> LlamaForCausalLM   (model_type llama)
//   MoE in every layer, no shared expert -> MixtralForCausalLM (model_type mixtral)
// Mapping: vocab_size, hidden_size = dim, intermediate_size = ffn_hidden (the expert hidden
// size for Mixtral), num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim = dim / n_heads, rms_norm_eps = norm_eps, rope_theta, num_local_experts =
// n_experts, num_experts_per_tok = top_k; hidden_act silu, no biases, untied embeddings,
// no rope scaling, no sliding window, router_jitter_noise 0.
// Anything else is refused with the reason: dense layers among MoE layers (Mixtral has MoE
// in every layer; transformers' architectures with mixed layers, Qwen3-MoE's mlp_only_layers,
// add per-head q/k norms hyperpar does not have), a shared expert (Qwen2-MoE's is gated by a
// sigmoid shared_expert_gate, hyperpar's is not), and on import rope scaling, biases, other
// activations or model types.
//
//   auto cfg = checkpoint::read_hf_config("llama-dir");        // from llama-dir/config.json
//   std::string json = checkpoint::hf_config_json(cfg, "float32");
#include <string>

#include "hyperpar/models/transformer.h"

namespace hyperpar::checkpoint {

/// The architecture hyperpar's model maps to ("LlamaForCausalLM" / "MixtralForCausalLM");
/// throws UsageError explaining why when none does.
std::string hf_architecture(const models::TransformerConfig& cfg);

/// config.json text for cfg, weights stored as `dtype` ("float32", "bfloat16").
std::string hf_config_json(const models::TransformerConfig& cfg, const std::string& dtype);

struct HFModelConfig {
  models::TransformerConfig model;
  std::string architecture;          // LlamaForCausalLM | MixtralForCausalLM
  bool tie_word_embeddings = false;  // lm_head is embed_tokens (no lm_head.weight stored)
};
/// Reads DIR/config.json; throws UsageError naming the key for anything hyperpar cannot
/// represent exactly.
HFModelConfig read_hf_config(const std::string& dir);

}  // namespace hyperpar::checkpoint
