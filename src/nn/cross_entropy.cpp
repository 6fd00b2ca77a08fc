#include "hyperpar/nn/cross_entropy.h"

#include <ATen/ATen.h>

#include <limits>
#include <memory>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"

namespace hyperpar::nn {

namespace {

// What the backward needs from the forward.
struct SavedSoftmax {
  at::Tensor logits;        // [rows, width] float, to recompute `probs` for a second backward
  at::Tensor row_max;       // [rows]
  at::Tensor probs;         // [rows, width] exp(logits - max); the first backward's gradient
  at::Tensor sum_exp;       // [rows]
  at::Tensor local_target;  // [rows, 1] target - start, clamped into the columns
  at::Tensor in_columns;    // [rows] float: 1 where these columns hold the row's target
  at::Tensor counted;       // [rows] float: 1 where the target is not ignore_index
  double rows_counted = 0;
};

}  // namespace

at::Tensor fused_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                               const VocabColumns& columns, int64_t ignore_index) {
  const int64_t width = logits.size(-1);
  HP_CHECK(targets.numel() * width == logits.numel(), "cross_entropy: ", targets.numel(),
           " targets for logits of shape ", logits.sizes(), " (expected one target per row)");
  const at::Tensor x = logits.reshape({-1, width}).to(at::kFloat);
  const at::Tensor t = targets.reshape({-1}).to(at::kLong);
  const at::Tensor counted = t.ne(ignore_index);
  // Split columns without a vocabulary size: only the lower bound can be checked here.
  const int64_t vocab = columns.vocab > 0     ? columns.vocab
                        : columns.combine_max ? std::numeric_limits<int64_t>::max()
                                              : width;
  const at::Tensor kept = t.masked_select(counted);
  HP_CHECK(
      kept.numel() == 0 || (kept.min().item<int64_t>() >= 0 && kept.max().item<int64_t>() < vocab),
      "cross_entropy: targets must be vocabulary ids in [0, ", vocab, ") or ", ignore_index,
      " (ignored)");
  auto saved = std::make_shared<SavedSoftmax>();
  auto forward = [&columns, &t, &counted, saved](const at::Tensor& in) {
    const int64_t width = in.size(1);
    at::Tensor row_max = at::amax(in, {1});
    if (columns.combine_max) columns.combine_max(row_max);
    saved->logits = in;
    saved->row_max = row_max;
    saved->probs = at::sub(in, row_max.unsqueeze(1)).exp_();
    const at::Tensor local = t - columns.start;
    const at::Tensor in_columns = counted.logical_and(local.ge(0)).logical_and(local.lt(width));
    saved->local_target = at::where(in_columns, local, at::zeros_like(local)).unsqueeze(1);
    saved->in_columns = in_columns.to(at::kFloat);
    saved->counted = counted.to(at::kFloat);
    saved->rows_counted = static_cast<double>(counted.sum().item<int64_t>());
    // [sum of exp over these columns; the target's logit where they hold it, else 0]
    at::Tensor sums = at::empty({2, in.size(0)}, in.options());
    at::Tensor sum_exp = sums[0];
    at::sum_out(sum_exp, saved->probs, {1});
    sums[1].copy_(in.gather(1, saved->local_target).squeeze(1).mul_(saved->in_columns));
    if (columns.combine_sums) columns.combine_sums(sums);
    saved->sum_exp = sums[0];
    // log S + m - T per row, over the counted rows (0 / 0 = nan when none, as PyTorch's mean)
    const at::Tensor per_row =
        saved->sum_exp.log().add_(row_max).sub_(sums[1]).mul_(saved->counted);
    return per_row.sum().div_(saved->rows_counted);
  };
  auto backward = [saved](const at::Tensor& grad_loss) {
    at::Tensor g = saved->probs.defined()
                       ? std::move(saved->probs)  // the first backward: in place
                       : at::sub(saved->logits, saved->row_max.unsqueeze(1)).exp_();
    const at::Tensor scale = grad_loss.to(at::kFloat) / saved->rows_counted;  // 0-dim
    g.mul_(saved->counted.div(saved->sum_exp).mul_(scale).unsqueeze(1));
    g.scatter_add_(1, saved->local_target, saved->in_columns.mul(scale).neg_().unsqueeze(1));
    return g;
  };
  return dtensor::differentiable(x, forward, backward, "fused_cross_entropy");
}

}  // namespace hyperpar::nn
