#pragma once
// Where each of hyperpar's parameters lives in a Hugging Face Llama/Mixtral checkpoint.
//
//   tok_embeddings.weight                 model.embed_tokens.weight
//   layers.L.attention_norm.weight        model.layers.L.input_layernorm.weight
//   layers.L.attention.wq|wk.weight       model.layers.L.self_attn.q_proj|k_proj.weight (rows
//   permuted) layers.L.attention.wv|wo.weight       model.layers.L.self_attn.v_proj|o_proj.weight
//   layers.L.ffn_norm.weight              model.layers.L.post_attention_layernorm.weight
//   layers.L.feed_forward.w1|w3|w2.weight model.layers.L.mlp.gate_proj|up_proj|down_proj.weight
//   layers.L.moe.router.weight            model.layers.L.block_sparse_moe.gate.weight
//   layers.L.moe.experts.w1|w2|w3 [E,..]
//   model.layers.L.block_sparse_moe.experts.{e}.w1|w2|w3.weight norm.weight, output.weight
//   model.norm.weight, lm_head.weight
// (Mixtral's per-expert names are the checkpoint format transformers writes and reads.)
//
// Rotary convention: hyperpar rotates interleaved pairs (x[2i], x[2i+1]) of each head;
// transformers' Llama rotates halves (x[i], x[i + hd/2]). The same model therefore stores
// q/k projection rows in a different order inside each head: hyperpar row 2i + s of a head
// is HF row s * hd/2 + i (s in {0, 1}). Rows never move between heads, so a block of whole
// heads maps to the same block.
//   head_dim 4, one head: hyperpar rows [r0 r1 r2 r3] = HF rows [r0 r2 r1 r3]
#include <ATen/core/Tensor.h>

#include <string>

#include "hyperpar/models/transformer.h"

namespace hyperpar::checkpoint {

struct HFTensorRef {
  enum Kind { kPlain, kRotaryRows, kExperts };
  Kind kind = kPlain;
  std::string name;  // for kExperts, with "{e}" where the expert number goes
  int64_t head_dim = 0;
  std::string expert(int64_t e) const;  // name with {e} replaced
};

/// How parameter `fqn` of cfg's Transformer is stored by transformers; throws UsageError for
/// a name hyperpar's model does not have.
HFTensorRef hf_tensor_of(const std::string& fqn, const models::TransformerConfig& cfg);

/// q/k rows [heads * hd, D]: hyperpar's interleaved order -> HF's half-split order.
at::Tensor rotary_rows_to_hf(const at::Tensor& w, int64_t head_dim);
/// The inverse.
at::Tensor rotary_rows_from_hf(const at::Tensor& w, int64_t head_dim);

}  // namespace hyperpar::checkpoint
