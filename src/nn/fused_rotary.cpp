// Rotary position embedding as one fused autograd Function on float32 CPU tensors
// (nn/fused_ops.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../core/simd_clones.h"
#include "hyperpar/core/error.h"
#include "hyperpar/nn/fused_ops.h"

namespace hyperpar::nn {

namespace {

// One position's heads: `heads` rows of hd = 2 * pairs values, rotated by the angles whose
// cos/sin are c/s; sign -1 rotates back (the backward).
HP_SIMD_CLONES
void rotate_position(const float* x, const float* c, const float* s, float* y, int64_t heads,
                     int64_t pairs, float sign) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* xr = x + h * 2 * pairs;
    float* yr = y + h * 2 * pairs;
    for (int64_t i = 0; i < pairs; ++i) {
      const float e = xr[2 * i], o = xr[2 * i + 1], si = sign * s[i];
      yr[2 * i] = e * c[i] - o * si;
      yr[2 * i + 1] = e * si + o * c[i];
    }
  }
}

// x [B, S, H, 2 * pairs] contiguous; tables [S, pairs] contiguous.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, float sign) {
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), pairs = x.size(3) / 2;
  at::Tensor y = at::empty_like(x);
  const float *xp = x.const_data_ptr<float>(), *cp = cos.const_data_ptr<float>(),
              *sp = sin.const_data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t row = H * 2 * pairs;
  at::parallel_for(0, B * S, 8, [&](int64_t begin, int64_t end) {
    for (int64_t bs = begin; bs < end; ++bs) {
      const int64_t pos = bs % S;
      rotate_position(xp + bs * row, cp + pos * pairs, sp + pos * pairs, yp + bs * row, H, pairs,
                      sign);
    }
  });
  return y;
}

struct RotaryFunction : public torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin) {
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    return rotate(x.contiguous(), cos, sin, 1.0f);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor cos = ctx->saved_data["cos"].toTensor(),
                     sin = ctx->saved_data["sin"].toTensor();
    return {rotate(grads[0].contiguous(), cos, sin, -1.0f), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  HP_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rotary: expected x [B, S, H, hd] with an even hd, ",
           "got ", x.sizes());
  const int64_t S = x.size(1), pairs = x.size(3) / 2;
  HP_CHECK(cos.numel() == S * pairs && sin.numel() == S * pairs, "rotary: tables of ", S, " x ",
           pairs, " expected for x ", x.sizes(), ", got ", cos.sizes(), " and ", sin.sizes());
  const bool fused = x.device().is_cpu() && x.scalar_type() == at::kFloat &&
                     cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat;
  if (fused)
    return RotaryFunction::apply(x, cos.reshape({S, pairs}).contiguous(),
                                 sin.reshape({S, pairs}).contiguous());
  const at::Tensor c = cos.reshape({1, S, 1, pairs}), s = sin.reshape({1, S, 1, pairs});
  at::Tensor pairs_view = x.reshape({x.size(0), S, x.size(2), pairs, 2});
  at::Tensor even = pairs_view.select(-1, 0), odd = pairs_view.select(-1, 1);
  at::Tensor re = even * c - odd * s, im = even * s + odd * c;
  return at::stack({re, im}, -1).reshape(x.sizes());
}

}  // namespace hyperpar::nn
