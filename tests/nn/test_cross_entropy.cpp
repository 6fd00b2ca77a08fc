// The fused cross entropy (nn/cross_entropy.h) against at::cross_entropy_loss in double
// precision: the loss and the gradient of the logits, with ignored rows, bf16 logits, a
// vocabulary split into columns whose partial results are combined by hand (what loss
// parallel's all-reduces do), and a second backward through a retained graph (zero-bubble
// pipelines). Tolerance 1e-6 relative for float32 (sums of a few hundred exponentials round at
// ~1e-7), 1e-2 for bf16 gradients (8 significant bits).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/nn/cross_entropy.h"

using namespace hyperpar;

namespace {

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() /
         (scale > 0 ? scale : 1.0);
}

struct Case {
  at::Tensor logits, targets;
};

Case make_case(int64_t rows, int64_t vocab) {
  at::manual_seed(3);
  Case c{at::randn({rows, vocab}) * 4, at::randint(vocab, {rows}, at::kLong)};
  c.targets[1] = -100;
  c.targets[rows - 1] = vocab - 1;
  return c;
}

// Reference loss and logit gradient in double.
std::pair<at::Tensor, at::Tensor> reference(const Case& c) {
  at::Tensor x = c.logits.to(at::kDouble).requires_grad_(true);
  at::Tensor loss = at::cross_entropy_loss(x, c.targets);
  loss.backward();
  return {loss.detach(), x.grad()};
}

}  // namespace

TEST(FusedCrossEntropy, MatchesCrossEntropyLossWithIgnoredRows) {
  const Case c = make_case(37, 101);
  const auto [ref_loss, ref_grad] = reference(c);
  at::Tensor x = c.logits.clone().requires_grad_(true);
  at::Tensor loss = nn::fused_cross_entropy(x.view({37, 1, 101}), c.targets.view({37, 1}));
  loss.backward();
  EXPECT_LE(rel_err(loss, ref_loss), 1e-6) << loss.item<double>() << " vs " << ref_loss;
  EXPECT_LE(rel_err(x.grad(), ref_grad), 1e-6);
  EXPECT_EQ(x.grad()[1].abs().max().item<float>(), 0.0f) << "an ignored row has a gradient";
}

TEST(FusedCrossEntropy, Bf16LogitsGetBf16Gradients) {
  const Case c = make_case(16, 64);
  const at::Tensor bf = c.logits.to(at::kBFloat16);
  const auto [ref_loss, ref_grad] = reference({bf.to(at::kFloat), c.targets});
  at::Tensor x = bf.clone().requires_grad_(true);
  at::Tensor loss = nn::fused_cross_entropy(x, c.targets);
  loss.backward();
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_LE(rel_err(loss, ref_loss), 1e-6);
  EXPECT_LE(rel_err(x.grad(), ref_grad), 1e-2);
}

// Three column blocks of one vocabulary, each a fused_cross_entropy call whose combine steps
// see the other blocks' partial results (computed here the same way), give the whole loss and
// each block's slice of the whole gradient.
TEST(FusedCrossEntropy, SplitColumnsCombineToTheWholeLoss) {
  const Case c = make_case(9, 30);
  const auto [ref_loss, ref_grad] = reference(c);
  const std::vector<int64_t> starts{0, 12, 24}, widths{12, 12, 6};
  const at::Tensor row_max = std::get<0>(c.logits.max(1));
  const at::Tensor sum_exp = (c.logits - row_max.unsqueeze(1)).exp().sum(1);
  const at::Tensor counted = c.targets.ne(-100);
  const at::Tensor target_logit =
      c.logits.gather(1, c.targets.clamp_min(0).unsqueeze(1)).squeeze(1) * counted;
  for (size_t b = 0; b < starts.size(); ++b) {
    at::Tensor x = c.logits.narrow(1, starts[b], widths[b]).clone().requires_grad_(true);
    nn::VocabColumns cols;
    cols.start = starts[b];
    cols.combine_max = [&](at::Tensor& m) { m.copy_(row_max); };
    cols.combine_sums = [&](at::Tensor& sums) {
      sums[0].copy_(sum_exp);
      sums[1].copy_(target_logit);
    };
    at::Tensor loss = nn::fused_cross_entropy(x, c.targets, cols);
    loss.backward();
    EXPECT_LE(rel_err(loss, ref_loss), 1e-6) << "block " << b;
    EXPECT_LE(rel_err(x.grad(), ref_grad.narrow(1, starts[b], widths[b])), 1e-6) << "block " << b;
  }
}

// The first backward reuses the forward's buffer for the gradient; a second one through the
// retained graph recomputes it, so the accumulated gradient is exactly twice the first.
TEST(FusedCrossEntropy, SecondBackwardThroughARetainedGraph) {
  const Case c = make_case(8, 50);
  at::Tensor x = c.logits.clone().requires_grad_(true);
  at::Tensor loss = nn::fused_cross_entropy(x, c.targets);
  loss.backward({}, /*retain_graph=*/true);
  const at::Tensor first = x.grad().clone();
  loss.backward();
  EXPECT_LE(rel_err(x.grad(), first * 2), 1e-6);
}

TEST(FusedCrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  const Case c = make_case(4, 10);
  at::Tensor bad = c.targets.clone();
  bad[0] = 10;
  try {
    nn::fused_cross_entropy(c.logits, bad);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("targets must be vocabulary ids in [0, 10)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nn::fused_cross_entropy(c.logits, c.targets.narrow(0, 0, 3)), std::exception);
}
