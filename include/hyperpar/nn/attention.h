#pragma once
// Rotary position embedding and causal multi-head attention with grouped KV heads.
//
// Rotary (interleaved pairs, as Llama's reference / torchtitan's complex form): for head dim
// hd and pair i in [0, hd/2), theta_i = base^(-2i/hd); at position p the pair
// (x[2i], x[2i+1]) is rotated by angle p*theta_i:
//   x'[2i] = x[2i] cos - x[2i+1] sin,   x'[2i+1] = x[2i] sin + x[2i+1] cos
// Angles are computed in double precision and rounded to float32 once; the tables are cached
// per (seq_len, head_dim, base, dtype).
//
// Attention on x [B, S, D]: q = wq x -> [B,S,H,hd], k = wk x, v = wv x -> [B,S,KV,hd];
// rotary on q and k; each KV head serves H/KV consecutive query heads; scores =
// q k^T / sqrt(hd) with a causal mask (key position <= query position); softmax over keys
// in float32; out = wo (softmax v) over the concatenated heads. Computed by
// at::scaled_dot_product_attention (is_causal, enable_gqa: no repeated KV tensors). No biases. Under TP the
// projections hold a subset of whole heads: the head counts come from the local shapes.
#include "hyperpar/nn/layers.h"

namespace hyperpar::nn {

/// Applies rotary embedding to x [B, S, H, hd] for positions 0..S-1.
at::Tensor apply_rotary(const at::Tensor& x, double base);

class Attention : public Module {
 public:
  Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, double rope_base,
            dtensor::InitScheme init, dtensor::InitScheme out_init);
  at::Tensor forward(const at::Tensor& x) override;
  int64_t dim, n_heads, n_kv_heads, head_dim;
  double rope_base;
  std::shared_ptr<Linear> wq, wk, wv, wo;
};

}  // namespace hyperpar::nn
