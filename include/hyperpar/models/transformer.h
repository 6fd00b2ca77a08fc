#pragma once
// Decoder-only Transformer (pre-norm, Llama-style), dense or with MoE in chosen layers.
//
//   h_0 = tok_embeddings[tokens]                                     [B, S, D]
//   per layer l:  a = h + attention(attention_norm(h))               (nn/attention.h)
//                 h = a + ffn(ffn_norm(a)),  ffn = feed_forward or moe (nn/moe.h)
//   logits = output(norm(h))                                         [B, S, V], untied head
//   loss = mean over B*S of cross_entropy(logits, targets), float32 (nn/cross_entropy.h;
//          next-token: targets are the inputs shifted by one, supplied by the caller)
// RMSNorm eps = norm_eps (1e-5), rotary base = rope_theta (10000), interleaved pairs.
//
// Parameter names: tok_embeddings.weight, layers.L.attention_norm.weight,
// layers.L.attention.{wq,wk,wv,wo}.weight, layers.L.ffn_norm.weight,
// layers.L.feed_forward.{w1,w2,w3}.weight | layers.L.moe.router.weight,
// layers.L.moe.experts.{w1,w2,w3}, layers.L.moe.shared_expert.{w1,w2,w3}.weight,
// norm.weight, output.weight.
//
// Init (torchtitan-style, not identical to it), drawn per element from counter-based Philox
// streams (dtensor/random.h), so the values do not depend on the layout:
//   norms                                  ones
//   tok_embeddings                         N(0, 1)
//   wq, wk, wv, w1, w3, router, experts w1/w3, shared_expert w1/w3
//                                          N(0, 0.02) truncated to [-0.04, 0.04] (+-2 std)
//   wo, w2, experts w2, shared_expert w2   N(0, s_l) truncated to [-2 s_l, 2 s_l],
//                                          s_l = 0.02 / sqrt(2 (l + 1)) for layer l
//   output                                 N(0, D^-0.5) truncated to +-3 D^-0.5
// Where torchtitan 0.3.0's Llama 3 differs: its trunc_normal_ calls keep PyTorch's default
// absolute bounds [-2, 2], which for std 0.02 (or s_l) truncate nothing; and it gives w3 the
// depth-scaled s_l (hyperpar: 0.02). Embeddings, norms, output and wo/w2 agree.
#include <memory>
#include <optional>
#include <vector>

#include "hyperpar/nn/attention.h"
#include "hyperpar/nn/moe.h"

namespace hyperpar::models {

struct TransformerConfig {
  int64_t vocab_size = 256;
  int64_t dim = 64;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t ffn_hidden = 128;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // MoE: layers listed in moe_layers use MoE with n_experts experts (0: dense model).
  int64_t n_experts = 0;
  int64_t top_k = 2;
  std::vector<int64_t> moe_layers;
  bool shared_expert = false;
  bool is_moe_layer(int64_t l) const;
  /// Throws with a clear message if sizes do not fit together.
  void validate() const;
  int64_t num_parameters() const;
};

class TransformerBlock : public nn::Module {
 public:
  TransformerBlock(const TransformerConfig& cfg, int64_t layer_id);
  at::Tensor forward(const at::Tensor& x) override;
  std::shared_ptr<nn::RMSNorm> attention_norm, ffn_norm;
  std::shared_ptr<nn::Attention> attention;
  std::shared_ptr<nn::FeedForward> feed_forward;  // dense layers
  std::shared_ptr<nn::MoE> moe;                   // MoE layers
};

/// The part of the model one pipeline rank builds (parallel/pipeline/stage_split.h): some
/// layers, each under its own name layers.L, and whether it holds the embedding and the head
/// (norm + output). The default is the whole model.
///   ModelPart{{4, 5, 12, 13}, false, true}  // layers 4, 5, 12, 13 and the head
struct ModelPart {
  std::optional<std::vector<int64_t>> layers;  // nullopt: all n_layers
  bool embedding = true, head = true;
};

class Transformer : public nn::Module {
 public:
  explicit Transformer(const TransformerConfig& cfg, const ModelPart& part = {});
  /// tokens [B, S] int64 -> logits [B, S, V] (the whole model only)
  at::Tensor forward(const at::Tensor& tokens) override;
  /// One pipeline stage, layers [first_layer, end_layer) of this part: x is tokens [B, S]
  /// when `embedding`, else the hidden state [B, S, D] (or its sequence shard); returns the
  /// logits when `head`, else the hidden state after layer end_layer - 1.
  at::Tensor forward_stage(int64_t first_layer, int64_t end_layer, bool embedding, bool head,
                           const at::Tensor& x);
  /// The block of layer `layer_id`; throws if this part does not hold it.
  TransformerBlock& layer(int64_t layer_id);
  /// Mean next-token cross-entropy of logits [B, S, V] against targets [B, S].
  static at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets);
  TransformerConfig cfg;
  std::shared_ptr<nn::Embedding> tok_embeddings;  // null when the part has no embedding
  std::vector<std::shared_ptr<TransformerBlock>> layers;
  std::vector<int64_t> layer_ids;     // layers[i] is layer layer_ids[i] (ascending)
  std::shared_ptr<nn::RMSNorm> norm;  // null when the part has no head
  std::shared_ptr<nn::Linear> output;
};

}  // namespace hyperpar::models
