// The fused RMSNorm, rotary and SwiGLU kernels (nn/fused_ops.h) against their formulas
// computed in double precision with plain ATen ops: outputs and the gradients of every input.
// Tolerance 2e-6 relative (max abs error over max abs value): float32 rounding of sums of up
// to a few hundred terms (~1e-7 each), not a looser algorithm. Shapes cover a last dim that is
// not a multiple of the SIMD lanes and row counts that are not a multiple of the 64-row blocks
// of the weight gradient. The weight gradient is bit-identical for 1 and 2 threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/fused_ops.h"

using namespace hyperpar;

namespace {

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean({-1}, true) + eps) * w;
}

at::Tensor rotary_reference(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
  const int64_t S = x.size(1), pairs = x.size(3) / 2;
  const at::Tensor cc = c.view({1, S, 1, pairs}), ss = s.view({1, S, 1, pairs});
  at::Tensor p = x.reshape({x.size(0), S, x.size(2), pairs, 2});
  at::Tensor e = p.select(-1, 0), o = p.select(-1, 1);
  return at::stack({e * cc - o * ss, e * ss + o * cc}, -1).reshape(x.sizes());
}

}  // namespace

TEST(FusedOps, RmsNormMatchesItsFormulaAndGradients) {
  at::manual_seed(3);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{2, 3, 16}, {5, 37}, {130, 512}}) {
    const int64_t d = shape.back();
    at::Tensor x = at::randn(shape).requires_grad_(true);
    at::Tensor w = (1 + 0.3 * at::randn({d})).requires_grad_(true);
    at::Tensor g = at::randn(shape);
    at::Tensor y = nn::rms_norm(x, w, 1e-5);
    y.backward(g);

    at::Tensor xd = x.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor wd = w.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor yd = rms_norm_reference(xd, wd, 1e-5);
    yd.backward(g.to(at::kDouble));
    EXPECT_LE(rel_err(y.detach(), yd.detach()), 2e-6) << shape;
    EXPECT_LE(rel_err(x.grad(), xd.grad()), 2e-6) << shape;
    EXPECT_LE(rel_err(w.grad(), wd.grad()), 2e-6) << shape;
  }
}

TEST(FusedOps, RmsNormWeightGradientDoesNotDependOnThreads) {
  at::manual_seed(4);
  at::Tensor x = at::randn({300, 64});
  at::Tensor g = at::randn({300, 64});
  const int threads = at::get_num_threads();
  std::vector<at::Tensor> grads;
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    at::Tensor w = at::ones({64}).requires_grad_(true);
    nn::rms_norm(x, w, 1e-6).backward(g);
    grads.push_back(w.grad().clone());
  }
  at::set_num_threads(threads);
  EXPECT_TRUE(grads[0].equal(grads[1]));
}

TEST(FusedOps, RmsNormOtherDtypesTakeTheComposite) {
  // bf16 (param_dtype bfloat16): the formula in float, rounded to bf16, times the weight.
  at::Tensor x = at::randn({4, 8}).to(at::kBFloat16);
  at::Tensor w = at::ones({8}, at::kBFloat16);
  at::Tensor y = nn::rms_norm(x, w, 1e-5);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_LE(
      rel_err(y.to(at::kFloat), rms_norm_reference(x.to(at::kDouble), w.to(at::kDouble), 1e-5)),
      1e-2);
}

TEST(FusedOps, RotaryMatchesItsFormulaAndGradients) {
  at::manual_seed(5);
  for (const auto& shape :
       std::vector<std::vector<int64_t>>{{2, 5, 3, 8}, {3, 7, 2, 34}, {2, 16, 4, 64}}) {
    const int64_t S = shape[1], pairs = shape[3] / 2;
    at::Tensor angles = at::rand({S, pairs}, at::kDouble) * 6.3;
    at::Tensor c = angles.cos().to(at::kFloat), s = angles.sin().to(at::kFloat);
    at::Tensor x = at::randn(shape).requires_grad_(true);
    at::Tensor g = at::randn(shape);
    at::Tensor y = nn::rotary(x, c, s);
    y.backward(g);

    at::Tensor xd = x.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor yd = rotary_reference(xd, c.to(at::kDouble), s.to(at::kDouble));
    yd.backward(g.to(at::kDouble));
    EXPECT_LE(rel_err(y.detach(), yd.detach()), 2e-6) << shape;
    EXPECT_LE(rel_err(x.grad(), xd.grad()), 2e-6) << shape;
    // A rotation keeps each pair's length.
    EXPECT_TRUE(at::allclose(y.detach().pow(2).sum(), x.detach().pow(2).sum(), 1e-5));
  }
  // A non-contiguous input (a transposed view) gives the same result as its contiguous copy.
  at::Tensor c = at::ones({4, 2}), s = at::zeros({4, 2});
  at::Tensor base = at::randn({2, 3, 4, 4});
  at::Tensor xt = base.transpose(1, 2);  // [2, 4, 3, 4], strided
  EXPECT_TRUE(nn::rotary(xt, c, s).equal(xt.contiguous()));
  EXPECT_THROW(nn::rotary(at::randn({2, 4, 3, 5}), c, s), Error);  // odd head dim
  EXPECT_THROW(nn::rotary(at::randn({2, 5, 3, 4}), c, s), Error);  // tables for 4 positions
}

TEST(FusedOps, SwiGluMatchesItsFormulaAndGradients) {
  // Last dims below, at and past the 8 float lanes (tails of 5, 7 and 0 elements); values up
  // to |x| ~ 20, where exp(-x) over/underflows toward the limits silu(x) -> x and -> 0.
  at::manual_seed(6);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{5}, {3, 7}, {4, 37}, {2, 9, 1408}}) {
    at::Tensor a = (at::randn(shape) * 6).requires_grad_(true);
    at::Tensor b = at::randn(shape).requires_grad_(true);
    at::Tensor g = at::randn(shape);
    at::Tensor y = nn::swiglu(a, b);
    y.backward(g);

    at::Tensor ad = a.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor bd = b.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor yd = ad / (1 + at::exp(-ad)) * bd;
    yd.backward(g.to(at::kDouble));
    EXPECT_LE(rel_err(y.detach(), yd.detach()), 2e-6) << shape;
    EXPECT_LE(rel_err(a.grad(), ad.grad()), 2e-6) << shape;
    EXPECT_LE(rel_err(b.grad(), bd.grad()), 2e-6) << shape;
    // ATen's composite in float32 (the same exp): within float rounding of it.
    EXPECT_LE(rel_err(y.detach(), (at::silu(a.detach()) * b.detach()).to(at::kDouble)), 1e-6);
  }
  // Extremes: silu(-100) = -0 (exp overflows to inf), silu(100) = 100; gradients finite.
  at::Tensor a = at::tensor({-100.0f, -20.0f, 0.0f, 20.0f, 100.0f}).requires_grad_(true);
  at::Tensor b = at::ones({5}).requires_grad_(true);
  at::Tensor y = nn::swiglu(a, b);
  y.sum().backward();
  EXPECT_TRUE(at::isfinite(y).all().item<bool>());
  EXPECT_TRUE(at::isfinite(a.grad()).all().item<bool>());
  EXPECT_FLOAT_EQ(y[4].item<float>(), 100.0f);
  EXPECT_FLOAT_EQ(std::abs(y[0].item<float>()), 0.0f);
  EXPECT_FLOAT_EQ(a.grad()[2].item<float>(), 0.5f);  // silu'(0) = 1/2
  // Strided inputs (transposed views) give what their contiguous copies give.
  at::Tensor at_ = at::randn({6, 10}).t(), bt = at::randn({6, 10}).t();
  EXPECT_TRUE(nn::swiglu(at_, bt).equal(nn::swiglu(at_.contiguous(), bt.contiguous())));
  EXPECT_THROW(nn::swiglu(at::randn({2, 3}), at::randn({3, 2})), Error);
}

TEST(FusedOps, SwiGluOtherDtypesTakeTheComposite) {
  at::Tensor a = at::randn({4, 8}).to(at::kBFloat16), b = at::randn({4, 8}).to(at::kBFloat16);
  EXPECT_TRUE(nn::swiglu(a, b).equal(at::silu(a) * b));
}
