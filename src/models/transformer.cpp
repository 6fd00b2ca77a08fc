#include "hyperpar/models/transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "hyperpar/core/error.h"
#include "hyperpar/core/profiler.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/nn/cross_entropy.h"

namespace hyperpar::models {

using dtensor::InitScheme;

bool TransformerConfig::is_moe_layer(int64_t l) const {
  return n_experts > 0 && std::find(moe_layers.begin(), moe_layers.end(), l) != moe_layers.end();
}

void TransformerConfig::validate() const {
  HP_CHECK(vocab_size > 0 && dim > 0 && n_layers > 0 && ffn_hidden > 0,
           "model: vocab_size, dim, n_layers and ffn_hidden must be positive");
  HP_CHECK(n_heads > 0 && dim % n_heads == 0, "model: dim ", dim, " is not divisible by n_heads ",
           n_heads);
  HP_CHECK((dim / n_heads) % 2 == 0, "model: head dim ", dim / n_heads,
           " must be even (rotary embedding)");
  HP_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "model: n_heads ", n_heads,
           " is not divisible by n_kv_heads ", n_kv_heads);
  for (int64_t l : moe_layers)
    HP_CHECK(l >= 0 && l < n_layers, "model: moe layer ", l, " is outside [0, ", n_layers, ")");
  if (!moe_layers.empty())
    HP_CHECK(n_experts > 0 && top_k > 0 && top_k <= n_experts,
             "model: moe needs n_experts > 0 "
             "and 1 <= top_k <= n_experts (got ",
             n_experts, ", ", top_k, ")");
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t hd = dim / n_heads;
  int64_t n = 2 * vocab_size * dim + dim;
  for (int64_t l = 0; l < n_layers; ++l) {
    n += 2 * dim + dim * n_heads * hd * 2 + dim * n_kv_heads * hd * 2;
    if (is_moe_layer(l))
      n += dim * n_experts + n_experts * 3 * dim * ffn_hidden +
           (shared_expert ? 3 * dim * ffn_hidden : 0);
    else
      n += 3 * dim * ffn_hidden;
  }
  return n;
}

namespace {
InitScheme trunc(double std) { return InitScheme::trunc_normal(0.0, std, -2 * std, 2 * std); }
}  // namespace

TransformerBlock::TransformerBlock(const TransformerConfig& cfg, int64_t layer_id)
    : Module("TransformerBlock") {
  const InitScheme init = InitScheme::trunc_normal(0.0, 0.02, -0.04, 0.04);
  const InitScheme out_init = trunc(0.02 / std::sqrt(2.0 * (layer_id + 1)));
  attention_norm =
      register_module("attention_norm", std::make_shared<nn::RMSNorm>(cfg.dim, cfg.norm_eps));
  attention = register_module("attention",
                              std::make_shared<nn::Attention>(cfg.dim, cfg.n_heads, cfg.n_kv_heads,
                                                              cfg.rope_theta, init, out_init));
  ffn_norm = register_module("ffn_norm", std::make_shared<nn::RMSNorm>(cfg.dim, cfg.norm_eps));
  if (cfg.is_moe_layer(layer_id))
    moe = register_module(
        "moe", std::make_shared<nn::MoE>(cfg.dim, cfg.ffn_hidden, cfg.n_experts, cfg.top_k,
                                         cfg.shared_expert, init, out_init));
  else
    feed_forward = register_module(
        "feed_forward", std::make_shared<nn::FeedForward>(cfg.dim, cfg.ffn_hidden, init, out_init));
}

at::Tensor TransformerBlock::forward(const at::Tensor& x) {
  at::Tensor h = x + (*attention)((*attention_norm)(x));
  at::Tensor n = (*ffn_norm)(h);
  return h + (moe ? (*moe)(n) : (*feed_forward)(n));
}

Transformer::Transformer(const TransformerConfig& c, const ModelPart& part)
    : Module("Transformer"), cfg(c) {
  cfg.validate();
  if (part.embedding)
    tok_embeddings =
        register_module("tok_embeddings", std::make_shared<nn::Embedding>(cfg.vocab_size, cfg.dim));
  if (part.layers) {
    layer_ids = *part.layers;
    for (size_t i = 0; i < layer_ids.size(); ++i)
      HP_CHECK(layer_ids[i] >= 0 && layer_ids[i] < cfg.n_layers &&
                   (i == 0 || layer_ids[i] > layer_ids[i - 1]),
               "model part: layers must be ascending ids in [0, ", cfg.n_layers, ")");
  } else {
    for (int64_t l = 0; l < cfg.n_layers; ++l) layer_ids.push_back(l);
  }
  for (int64_t l : layer_ids)
    layers.push_back(
        register_module("layers." + std::to_string(l), std::make_shared<TransformerBlock>(cfg, l)));
  if (part.head) {
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(cfg.dim, cfg.norm_eps));
    const double s = 1.0 / std::sqrt(static_cast<double>(cfg.dim));
    output = register_module(
        "output", std::make_shared<nn::Linear>(cfg.dim, cfg.vocab_size, false,
                                               InitScheme::trunc_normal(0.0, s, -3 * s, 3 * s)));
  }
}

namespace {

// One block's forward; when profiling, its forward and its backward as spans (the backward from
// its output's gradient arriving until its input's gradient leaves, FSDP's refill included),
// through identity autograd nodes on either side that only read the clock.
at::Tensor run_block(TransformerBlock& block, int64_t layer_id, const at::Tensor& x) {
  if (!profile::enabled()) return block(x);
  const std::string name = "layers." + std::to_string(layer_id);
  auto grad_arrived = std::make_shared<int64_t>(0);
  const auto identity = [](const at::Tensor& t) { return t; };
  at::Tensor in = x;
  if (x.requires_grad())
    in = dtensor::differentiable(
        x, identity,
        [name, grad_arrived](const at::Tensor& g) {
          profile::complete(name + " backward", "backward", *grad_arrived, profile::now_us());
          return g;
        },
        "profile_block_input");
  at::Tensor y;
  {
    profile::Span span("forward", name);
    y = block(in);
  }
  if (!y.requires_grad()) return y;
  return dtensor::differentiable(
      y, identity,
      [grad_arrived](const at::Tensor& g) {
        *grad_arrived = profile::now_us();
        return g;
      },
      "profile_block_output");
}

}  // namespace

at::Tensor Transformer::forward(const at::Tensor& tokens) {
  HP_CHECK(tok_embeddings && norm && static_cast<int64_t>(layers.size()) == cfg.n_layers,
           "Transformer forward: this rank holds one part of a pipelined model; run its "
           "stages with forward_stage");
  nn::check_materialized(*this, "Transformer forward");
  at::Tensor h = (*tok_embeddings)(tokens);
  for (size_t i = 0; i < layers.size(); ++i) h = run_block(*layers[i], layer_ids[i], h);
  return (*output)((*norm)(h));
}

TransformerBlock& Transformer::layer(int64_t layer_id) {
  for (size_t i = 0; i < layer_ids.size(); ++i)
    if (layer_ids[i] == layer_id) return *layers[i];
  throw Error(detail::concat("model part: layer ", layer_id, " is not on this rank"));
}

at::Tensor Transformer::forward_stage(int64_t first_layer, int64_t end_layer, bool embedding,
                                      bool head, const at::Tensor& x) {
  HP_CHECK(!embedding || tok_embeddings, "forward_stage: this part has no embedding");
  HP_CHECK(!head || norm, "forward_stage: this part has no head");
  at::Tensor h = embedding ? (*tok_embeddings)(x) : x;
  for (int64_t l = first_layer; l < end_layer; ++l) h = run_block(layer(l), l, h);
  return head ? (*output)((*norm)(h)) : h;
}

at::Tensor Transformer::loss(const at::Tensor& logits, const at::Tensor& targets) {
  return nn::fused_cross_entropy(logits, targets);
}

}  // namespace hyperpar::models
