// Optimizers against their formulas computed in double precision (PyTorch's AdamW and SGD):
// three steps with weight decay on parameters of several shapes, one of them with no
// gradient (left untouched). Tolerance 1e-6 relative: the updates are float32 arithmetic.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "hyperpar/optim/optimizer.h"

using namespace hyperpar;

namespace {

nn::Parameter make_param(std::vector<int64_t> shape, uint64_t seed) {
  nn::Parameter p;
  p.shape = shape;
  at::manual_seed(seed);
  p.data = at::randn(shape).requires_grad_(true);
  return p;
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b).abs() / (b.abs() + 1e-12)).max().item<double>();
}

}  // namespace

// AdamW's formula in double precision, one step on (p, m, v) with gradient g at step t.
struct AdamWReference {
  double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  void step(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& g, int t) const {
    const at::Tensor gd = g.to(at::kDouble);
    p = p * (1 - lr * wd);
    m = b1 * m + (1 - b1) * gd;
    v = b2 * v + (1 - b2) * gd * gd;
    const double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    p = p - lr / c1 * m / (v.sqrt() / std::sqrt(c2) + eps);
  }
};

TEST(Optimizer, AdamWMatchesItsFormula) {
  nn::Parameter a = make_param({4, 3}, 1), b = make_param({5}, 2), frozen = make_param({2}, 3);
  const at::Tensor frozen_before = frozen.data.detach().clone();
  const AdamWReference ref;
  optim::AdamW opt({&a, &b, &frozen}, ref.lr, ref.wd, ref.b1, ref.b2, ref.eps);
  std::vector<at::Tensor> p{a.data.detach().to(at::kDouble), b.data.detach().to(at::kDouble)};
  std::vector<at::Tensor> m{at::zeros_like(p[0]), at::zeros_like(p[1])};
  std::vector<at::Tensor> v{at::zeros_like(p[0]), at::zeros_like(p[1])};
  for (int t = 1; t <= 3; ++t) {
    std::vector<at::Tensor> g{at::randn({4, 3}), at::randn({5})};
    a.data.mutable_grad() = g[0].clone();
    b.data.mutable_grad() = g[1].clone();
    opt.step();
    for (size_t i = 0; i < 2; ++i) ref.step(p[i], m[i], v[i], g[i], t);
    EXPECT_LE(max_rel(a.data.detach(), p[0]), 1e-6) << "step " << t;
    EXPECT_LE(max_rel(b.data.detach(), p[1]), 1e-6) << "step " << t;
  }
  EXPECT_EQ(opt.steps_taken(), 3);
  EXPECT_TRUE(at::equal(frozen.data.detach(), frozen_before));
  const auto state = opt.state_tensors();
  ASSERT_EQ(state.size(), 6u);
  EXPECT_LE(max_rel(state[0].tensor, m[0]), 1e-6);  // exp_avg of a
  EXPECT_LE(max_rel(state[1].tensor, v[0]), 1e-6);  // exp_avg_sq of a
}

// Every updated parameter's version counter moves, as after any in-place op, so that code
// telling a changed shard by its version (FSDP's host-shared parameters and its prefetch
// check) sees the update; the fused kernel alone, called from C++, leaves it. A parameter
// without a gradient is not updated and keeps its version.
TEST(Optimizer, AStepMovesTheUpdatedParametersVersions) {
  nn::Parameter a = make_param({4, 3}, 1), frozen = make_param({2}, 3);
  optim::AdamW adamw({&a, &frozen}, 1e-2, 0.1, 0.9, 0.95, 1e-8);
  a.data.mutable_grad() = at::randn({4, 3});
  const auto a0 = a.data._version(), f0 = frozen.data._version();
  adamw.step();
  EXPECT_GT(a.data._version(), a0);
  EXPECT_EQ(frozen.data._version(), f0);
  nn::Parameter s = make_param({5}, 2);
  optim::SGD sgd({&s}, 1e-2, 0.9, 0.0);
  s.data.mutable_grad() = at::randn({5});
  const auto s0 = s.data._version();
  sgd.step();
  EXPECT_GT(s.data._version(), s0);
}

// The fused kernel runs once per dtype; a parameter that is a strided view (not contiguous)
// and a gradient of another dtype (cast to the parameter's) take the same formula.
TEST(Optimizer, AdamWMixedDtypesAndStridedParametersMatchTheFormula) {
  nn::Parameter f = make_param({3, 4}, 5), d = make_param({6}, 6), strided = make_param({4, 5}, 7);
  d.data = d.data.detach().to(at::kDouble).requires_grad_(true);
  strided.data = strided.data.detach().t().requires_grad_(true);  // a {5, 4} view, not contiguous
  ASSERT_FALSE(strided.data.is_contiguous());
  const AdamWReference ref;
  optim::AdamW opt({&f, &d, &strided}, ref.lr, ref.wd, ref.b1, ref.b2, ref.eps);
  std::vector<nn::Parameter*> ps{&f, &d, &strided};
  std::vector<at::Tensor> p, m, v;
  for (auto* q : ps) {
    p.push_back(q->data.detach().to(at::kDouble));
    m.push_back(at::zeros_like(p.back()));
    v.push_back(at::zeros_like(p.back()));
  }
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < ps.size(); ++i) {
      const at::Tensor g = at::randn(ps[i]->data.sizes(), at::kDouble);
      ps[i]->data.mutable_grad() = i == 0 ? g.clone() : g.to(at::kFloat);  // f: a double grad
      ref.step(p[i], m[i], v[i], ps[i]->data.grad(), t);
    }
    opt.step();
    for (size_t i = 0; i < ps.size(); ++i) {
      // The double parameter is double arithmetic from float gradients: 1e-12.
      const double tol = ps[i]->data.scalar_type() == at::kDouble ? 1e-12 : 1e-6;
      EXPECT_LE(max_rel(ps[i]->data.detach(), p[i]), tol) << "parameter " << i << " step " << t;
    }
  }
}

TEST(Optimizer, SgdWithMomentumMatchesItsFormula) {
  nn::Parameter a = make_param({3, 2}, 4);
  const double lr = 0.1, mom = 0.9, wd = 0.01;
  optim::SGD opt({&a}, lr, mom, wd);
  at::Tensor p = a.data.detach().to(at::kDouble), buf;
  for (int t = 1; t <= 3; ++t) {
    const at::Tensor g = at::randn({3, 2});
    a.data.mutable_grad() = g.clone();
    opt.step();
    const at::Tensor gd = g.to(at::kDouble) + wd * p;
    buf = t == 1 ? gd : mom * buf + gd;
    p = p - lr * buf;
    EXPECT_LE(max_rel(a.data.detach(), p), 1e-6) << "step " << t;
  }
}
