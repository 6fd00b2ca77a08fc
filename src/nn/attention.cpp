#include "hyperpar/nn/attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "hyperpar/core/error.h"

namespace hyperpar::nn {

at::Tensor apply_rotary(const at::Tensor& x, double base) {
  const int64_t S = x.size(1), hd = x.size(3);
  HP_CHECK(hd % 2 == 0, "rotary embedding needs an even head dim, got ", hd);
  std::vector<float> cosv(S * hd / 2), sinv(S * hd / 2);
  for (int64_t p = 0; p < S; ++p)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double theta = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double a = static_cast<double>(p) * theta;
      cosv[p * hd / 2 + i] = static_cast<float>(std::cos(a));
      sinv[p * hd / 2 + i] = static_cast<float>(std::sin(a));
    }
  auto opts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor c = at::tensor(cosv, opts).view({1, S, 1, hd / 2}).to(x.scalar_type());
  at::Tensor s = at::tensor(sinv, opts).view({1, S, 1, hd / 2}).to(x.scalar_type());
  at::Tensor pairs = x.reshape({x.size(0), S, x.size(2), hd / 2, 2});
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  at::Tensor re = even * c - odd * s, im = even * s + odd * c;
  return at::stack({re, im}, -1).reshape(x.sizes());
}

Attention::Attention(int64_t dim_, int64_t n_heads_, int64_t n_kv_heads_, double rope_base_,
                     dtensor::InitScheme init, dtensor::InitScheme out_init)
    : Module("Attention"),
      dim(dim_),
      n_heads(n_heads_),
      n_kv_heads(n_kv_heads_),
      head_dim(dim_ / n_heads_),
      rope_base(rope_base_) {
  HP_CHECK(n_heads > 0 && dim % n_heads == 0, "Attention: dim ", dim,
           " must be divisible by n_heads ", n_heads);
  HP_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "Attention: n_heads ", n_heads,
           " must be divisible by n_kv_heads ", n_kv_heads);
  wq = register_module("wq", std::make_shared<Linear>(dim, n_heads * head_dim, false, init));
  wk = register_module("wk", std::make_shared<Linear>(dim, n_kv_heads * head_dim, false, init));
  wv = register_module("wv", std::make_shared<Linear>(dim, n_kv_heads * head_dim, false, init));
  wo = register_module("wo", std::make_shared<Linear>(n_heads * head_dim, dim, false, out_init));
}

at::Tensor Attention::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1);
  at::Tensor q = (*wq)(x), k = (*wk)(x), v = (*wv)(x);
  const int64_t h = q.size(-1) / head_dim, kv = k.size(-1) / head_dim;  // local heads
  HP_CHECK(h > 0 && kv > 0 && h % kv == 0, "Attention: local heads ", h, " / kv heads ", kv,
           " (TP must split whole heads and keep n_heads / n_kv_heads per rank)");
  q = apply_rotary(q.view({B, S, h, head_dim}), rope_base);
  k = apply_rotary(k.view({B, S, kv, head_dim}), rope_base);
  v = v.view({B, S, kv, head_dim});
  if (h != kv) {
    k = k.repeat_interleave(h / kv, 2);
    v = v.repeat_interleave(h / kv, 2);
  }
  q = q.transpose(1, 2);  // [B, h, S, hd]
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  at::Tensor mask = at::ones({S, S}, at::TensorOptions().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(q.scalar_type());
  at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape({B, S, h * head_dim});
  return (*wo)(out);
}

}  // namespace hyperpar::nn
