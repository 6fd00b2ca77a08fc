// Linear projections of one input through one autograd node (nn/shared_input_linear.h)
// against separate matmuls: outputs bitwise equal (the same ATen matmul per weight), input
// and weight gradients within 1e-6 relative (max abs error over max abs value: float32
// rounding of sums over 48..96 terms, accumulated in another order; a wrong or missing term
// is off by O(1)). Also: gradients of a subset of outputs, frozen weights, hooks and the
// fallback for modules with a bias.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "hyperpar/nn/layers.h"
#include "hyperpar/nn/shared_input_linear.h"

using namespace hyperpar;

namespace {

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got - want).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

struct Case {
  at::Tensor x;
  std::vector<at::Tensor> ws, gs;  // weights, output gradients
};

Case make_case(std::vector<int64_t> outs, int64_t in, uint64_t seed) {
  at::manual_seed(seed);
  Case c;
  c.x = at::randn({3, 5, in}).requires_grad_(true);
  for (int64_t o : outs) {
    c.ws.push_back(at::randn({o, in}).requires_grad_(true));
    c.gs.push_back(at::randn({3, 5, o}));
  }
  return c;
}

// (outputs, grad of x, grads of the weights) of the separate matmuls or the shared node.
std::tuple<std::vector<at::Tensor>, at::Tensor, std::vector<at::Tensor>> run(const Case& c,
                                                                             bool shared) {
  at::Tensor x = c.x.detach().clone().requires_grad_(true);
  std::vector<at::Tensor> ws;
  for (const auto& w : c.ws) ws.push_back(w.detach().clone().requires_grad_(true));
  std::vector<at::Tensor> ys;
  if (shared) {
    ys = nn::linears_on_shared_input(x, ws);
  } else {
    for (const auto& w : ws) ys.push_back(at::matmul(x, w.t()));
  }
  torch::autograd::backward(ys, c.gs);
  std::vector<at::Tensor> gw;
  for (const auto& w : ws) gw.push_back(w.grad());
  return {ys, x.grad(), gw};
}

}  // namespace

TEST(SharedInputLinear, MatchesSeparateMatmuls) {
  const Case c = make_case({64, 32, 32}, 48, 1);
  const auto [ys, gx, gw] = run(c, true);
  const auto [ys0, gx0, gw0] = run(c, false);
  ASSERT_EQ(ys.size(), 3u);
  for (size_t i = 0; i < ys.size(); ++i) {
    EXPECT_TRUE(at::equal(ys[i], ys0[i])) << "output " << i;
    EXPECT_LT(rel_err(gw[i], gw0[i]), 1e-6) << "weight " << i;
    EXPECT_TRUE(gw[i].is_contiguous()) << "weight gradient " << i << " is [out, in] contiguous";
  }
  EXPECT_LT(rel_err(gx, gx0), 1e-6);
}

TEST(SharedInputLinear, OnlyTheUsedOutputsContribute) {
  Case c = make_case({16, 24}, 96, 2);
  at::Tensor x = c.x.detach().clone().requires_grad_(true);
  at::Tensor w0 = c.ws[0].detach().clone().requires_grad_(true);
  at::Tensor w1 = c.ws[1].detach().clone();  // frozen
  const auto ys = nn::linears_on_shared_input(x, {w0, w1});
  EXPECT_TRUE(ys[0].requires_grad() && ys[1].requires_grad()) << "outputs are in the graph";
  ys[1].backward(c.gs[1]);  // only the frozen weight's output is used
  EXPECT_FALSE(w0.grad().defined()) << "an unused output gives its weight no gradient";
  EXPECT_FALSE(w1.grad().defined());
  EXPECT_LT(rel_err(x.grad(), at::matmul(c.gs[1], w1)), 1e-6);
}

TEST(SharedInputLinear, ModulesKeepTheirHooksAndFallBackWithABias) {
  at::manual_seed(3);
  nn::Linear a(8, 6, false), b(8, 4, false), biased(8, 4, true);
  for (auto* m : {&a, &b, &biased}) {
    m->to_empty(c10::kCPU);
    m->init_weights(7);
  }
  int hook_calls = 0;
  b.add_forward_hook([&](nn::Module&, const at::Tensor&, const at::Tensor& y) {
    ++hook_calls;
    return y * 2;
  });
  const at::Tensor x = at::randn({2, 8});
  const auto ys = nn::call_linears_on_shared_input({&a, &b}, x);
  EXPECT_EQ(hook_calls, 1);
  EXPECT_TRUE(at::equal(ys[0], a(x)));
  EXPECT_TRUE(at::equal(ys[1], b(x))) << "the forward hook ran on the shared path's output";
  const auto yb = nn::call_linears_on_shared_input({&a, &biased}, x);
  EXPECT_TRUE(at::equal(yb[1], biased(x))) << "a biased module is called as itself";
  struct Doubled : nn::Linear {
    using nn::Linear::Linear;
    at::Tensor forward(const at::Tensor& in) override { return nn::Linear::forward(in) * 2; }
  } doubled(8, 4, false);
  doubled.to_empty(c10::kCPU);
  doubled.init_weights(7);
  const auto yd = nn::call_linears_on_shared_input({&a, &doubled}, x);
  EXPECT_TRUE(at::equal(yd[1], doubled(x))) << "a subclass's own forward runs";
}

TEST(SharedInputLinear, RejectsAWeightOfAnotherInputDim) {
  const at::Tensor x = at::randn({2, 8});
  EXPECT_THROW(nn::linears_on_shared_input(x, {at::randn({4, 8}), at::randn({4, 7})}),
               std::exception);
}
