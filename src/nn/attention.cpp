#include "hyperpar/nn/attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/fused_ops.h"
#include "hyperpar/nn/shared_input_linear.h"

namespace hyperpar::nn {

namespace {

// cos/sin tables [1, S, 1, hd/2] per (S, hd, base, dtype), built once (angles in double,
// rounded once) and reused by every layer and step: rebuilding them with a loop of pow()
// per forward showed up in the single-process profile.
struct RotaryKey {
  int64_t seq, head_dim;
  double base;
  c10::ScalarType dtype;
  bool operator<(const RotaryKey& o) const {
    return std::tie(seq, head_dim, base, dtype) < std::tie(o.seq, o.head_dim, o.base, o.dtype);
  }
};

std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t S, int64_t hd, double base,
                                                c10::ScalarType dtype) {
  static std::mutex mu;
  static std::map<RotaryKey, std::pair<at::Tensor, at::Tensor>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const RotaryKey key{S, hd, base, dtype};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  at::NoGradGuard no_grad;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
  at::Tensor theta = at::pow(base, at::arange(0, hd / 2, f64) * (-2.0 / static_cast<double>(hd)));
  at::Tensor angles = at::outer(at::arange(0, S, f64), theta);  // [S, hd/2]
  at::Tensor c = angles.cos().to(at::kFloat).to(dtype).view({1, S, 1, hd / 2});
  at::Tensor s = angles.sin().to(at::kFloat).to(dtype).view({1, S, 1, hd / 2});
  return cache.emplace(key, std::make_pair(c, s)).first->second;
}

}  // namespace

at::Tensor apply_rotary(const at::Tensor& x, double base) {
  const int64_t S = x.size(1), hd = x.size(3);
  HP_CHECK(hd % 2 == 0, "rotary embedding needs an even head dim, got ", hd);
  const auto [c, s] = rotary_tables(S, hd, base, x.scalar_type());
  return rotary(x, c, s);
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
  const auto qkv = call_linears_on_shared_input({wq.get(), wk.get(), wv.get()}, x);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const int64_t h = q.size(-1) / head_dim, kv = k.size(-1) / head_dim;  // local heads
  HP_CHECK(h > 0 && kv > 0 && h % kv == 0, "Attention: local heads ", h, " / kv heads ", kv,
           " (TP must split whole heads and keep n_heads / n_kv_heads per rank)");
  // Rotary and attention keep no activation of their own under selective checkpointing:
  // only q, k, v (matmul outputs) are saved and the rest is recomputed in backward.
  auto core = [this, B, S, h, kv](const std::vector<at::Tensor>& in) {
    at::Tensor qr = apply_rotary(in[0].view({B, S, h, head_dim}), rope_base).transpose(1, 2);
    at::Tensor kr = apply_rotary(in[1].view({B, S, kv, head_dim}), rope_base).transpose(1, 2);
    at::Tensor vr = in[2].view({B, S, kv, head_dim}).transpose(1, 2);  // [B, kv, S, hd]
    // LibTorch's fused attention: causal, scale 1/sqrt(hd), softmax accumulated in float32,
    // KV heads shared by h/kv query heads without materialising the repeats (enable_gqa).
    at::Tensor o = at::scaled_dot_product_attention(qr, kr, vr, /*attn_mask=*/std::nullopt,
                                                    /*dropout_p=*/0.0, /*is_causal=*/true,
                                                    /*scale=*/std::nullopt,
                                                    /*enable_gqa=*/h != kv);
    return o.transpose(1, 2).reshape({B, S, h * head_dim});
  };
  at::Tensor out = checkpoint_mode() == CheckpointMode::kPointwise
                       ? checkpoint(core, {q, k, v}, "attention core")
                       : core({q, k, v});
  return (*wo)(out);
}

}  // namespace hyperpar::nn
