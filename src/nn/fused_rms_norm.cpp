// RMSNorm as one fused autograd Function on float32 CPU tensors (nn/fused_ops.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "../core/simd_clones.h"
#include "hyperpar/nn/fused_ops.h"

namespace hyperpar::nn {

namespace {

using hyperpar::simd::kLanes;

// y = (x * r) * w for one row; returns r = 1 / sqrt(mean(x^2) + eps).
HP_SIMD_CLONES
float norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * x[i + j];
  float ss = 0;
  for (int j = 0; j < kLanes; ++j) ss += acc[j];
  for (; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t k = 0; k < n; ++k) y[k] = x[k] * r * w[k];
  return r;
}

// With nrm = x * r and dn = g * w: dx = r * (dn - nrm * mean(dn * nrm)), and the weight's
// gradient g * nrm is added to dw (this block's partial sum).
HP_SIMD_CLONES
void norm_row_backward(const float* g, const float* x, const float* w, float r, float* dx,
                       float* dw, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += g[i + j] * w[i + j] * x[i + j];
  float dot = 0;  // sum(g * w * x)
  for (int j = 0; j < kLanes; ++j) dot += acc[j];
  for (; i < n; ++i) dot += g[i] * w[i] * x[i];
  const float m = dot * r / static_cast<float>(n);  // mean(dn * nrm)
  for (int64_t k = 0; k < n; ++k) {
    const float nrm = x[k] * r;
    dx[k] = r * (g[k] * w[k] - nrm * m);
    if (dw) dw[k] += g[k] * nrm;
  }
}

HP_SIMD_CLONES
void add_row(float* dst, const float* src, int64_t n) {
  for (int64_t k = 0; k < n; ++k) dst[k] += src[k];
}

// Rows per block of the weight's gradient: partial sums per block, blocks added in order.
constexpr int64_t kBlockRows = 64;

struct RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    at::Tensor xc = x.contiguous(), wc = weight.contiguous();
    const int64_t n = xc.size(-1), rows = n == 0 ? 0 : xc.numel() / n;
    at::Tensor y = at::empty_like(xc);
    at::Tensor rstd = at::empty({rows}, xc.options());
    const float* xp = xc.const_data_ptr<float>();
    const float* wp = wc.const_data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* rp = rstd.data_ptr<float>();
    const auto e = static_cast<float>(eps);
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row)
        rp[row] = norm_row(xp + row * n, wp, yp + row * n, n, e);
    });
    ctx->save_for_backward({xc, wc, rstd});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    at::Tensor g = grads[0].contiguous();
    const int64_t n = x.size(-1), rows = rstd.numel();
    const bool want_dw = ctx->needs_input_grad(1);
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    at::Tensor dx = at::empty_like(x);
    at::Tensor partial = want_dw ? at::zeros({blocks, n}, x.options()) : at::Tensor();
    const float *gp = g.const_data_ptr<float>(), *xp = x.const_data_ptr<float>(),
                *wp = w.const_data_ptr<float>(), *rp = rstd.const_data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    float* pp = want_dw ? partial.data_ptr<float>() : nullptr;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        for (int64_t row = b * kBlockRows; row < std::min(rows, (b + 1) * kBlockRows); ++row)
          norm_row_backward(gp + row * n, xp + row * n, wp, rp[row], dxp + row * n,
                            pp ? pp + b * n : nullptr, n);
    });
    at::Tensor dw;
    if (want_dw) {
      dw = at::zeros({n}, x.options());
      for (int64_t b = 0; b < blocks; ++b) add_row(dw.data_ptr<float>(), pp + b * n, n);
    }
    return {dx, dw, at::Tensor()};
  }
};

bool fusable(const at::Tensor& x, const at::Tensor& weight) {
  return x.device().is_cpu() && weight.device().is_cpu() && x.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat && x.dim() >= 1 && weight.dim() == 1 &&
         weight.size(0) == x.size(-1) && x.size(-1) > 0;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (fusable(x, weight)) return RMSNormFunction::apply(x, weight, eps);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

}  // namespace hyperpar::nn
