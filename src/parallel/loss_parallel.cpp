#include "hyperpar/parallel/loss_parallel.h"

#include <ATen/ATen.h>

#include <memory>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/parallel/tensor_parallel.h"

namespace hyperpar::parallel {

namespace {

// What the backward needs from the forward. `probs` starts as exp(logits - max) and is
// turned into the gradient in place: the node runs its backward once (retain_graph is
// refused rather than answered with a gradient computed from overwritten values).
struct SavedSoftmax {
  at::Tensor probs;         // [rows, chunk] float
  at::Tensor sum_exp;       // [rows]
  at::Tensor local_target;  // [rows, 1] target - shard start, clamped into the shard
  at::Tensor in_shard;      // [rows] float: 1 where this shard holds the row's target
  at::Tensor counted;       // [rows] float: 1 where the target is not ignore_index
  double rows_counted = 0;
  bool used = false;
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        const mesh::DeviceMesh& tp, int64_t vocab_size,
                                        int64_t ignore_index) {
  HP_CHECK(tp.ndim() == 1, "vocab_parallel_cross_entropy: needs a 1-D tp mesh, got ",
           tp.to_string());
  const auto coord = tp.get_coordinate();
  HP_CHECK(coord.has_value(), "vocab_parallel_cross_entropy: this rank is not in the tp mesh ",
           tp.to_string());
  const auto shard = dtensor::chunk_range(vocab_size, tp.size(), (*coord)[0]);
  const int64_t chunk = local_logits.size(-1);
  HP_CHECK(chunk == shard.size, "vocab_parallel_cross_entropy: logits of this rank have ", chunk,
           " vocabulary entries, expected ", shard.size, " (chunk ", (*coord)[0], " of ",
           vocab_size, " over ", tp.size(), " tp ranks)");
  HP_CHECK(targets.numel() * chunk == local_logits.numel(),
           "vocab_parallel_cross_entropy: ", targets.numel(), " targets for logits of shape ",
           local_logits.sizes(), " (expected one target per row)");
  const at::Tensor x = local_logits.reshape({-1, chunk}).to(at::kFloat);
  const at::Tensor t = targets.reshape({-1}).to(at::kLong);
  auto group = tp.get_group(0);
  auto saved = std::make_shared<SavedSoftmax>();

  auto forward = [=](const at::Tensor& logits) {
    comm::TrafficScope traffic(tp_traffic_scope("output loss"));
    at::Tensor row_max = std::get<0>(logits.max(1));
    group->all_reduce(row_max, comm::ReduceOp::kMax, {"output loss max"});
    saved->probs = at::sub(logits, row_max.unsqueeze(1)).exp_();
    const at::Tensor counted = t.ne(ignore_index);
    const at::Tensor local = t - shard.start;
    const at::Tensor in_shard = counted.logical_and(local.ge(0)).logical_and(local.lt(chunk));
    saved->local_target = at::where(in_shard, local, at::zeros_like(local)).unsqueeze(1);
    saved->in_shard = in_shard.to(at::kFloat);
    saved->counted = counted.to(at::kFloat);
    saved->rows_counted = static_cast<double>(counted.sum().item<int64_t>());
    // [sum of exp over this shard; the target's logit where this shard holds it, else 0]
    at::Tensor sums = at::empty({2, logits.size(0)}, logits.options());
    at::Tensor sum_exp = sums[0];
    at::sum_out(sum_exp, saved->probs, {1});
    sums[1].copy_(logits.gather(1, saved->local_target).squeeze(1).mul_(saved->in_shard));
    group->all_reduce(sums, comm::ReduceOp::kSum, {"output loss sums"});
    saved->sum_exp = sum_exp;
    // log S + m - T per row, over the counted rows (0 / 0 = nan when none, as PyTorch's mean)
    const at::Tensor per_row = sum_exp.log().add_(row_max).sub_(sums[1]).mul_(saved->counted);
    return per_row.sum().div_(saved->rows_counted);
  };
  auto backward = [saved](const at::Tensor& grad_loss) {
    HP_CHECK(!saved->used,
             "vocab_parallel_cross_entropy: backward ran twice through one loss (retain_graph "
             "is not supported by loss parallel)");
    saved->used = true;
    const at::Tensor scale = grad_loss.to(at::kFloat) / saved->rows_counted;  // 0-dim
    // d loss / d logit = (softmax - onehot(target)) * scale, ignored rows 0
    at::Tensor g = saved->probs;
    g.mul_(saved->counted.div(saved->sum_exp).mul_(scale).unsqueeze(1));
    g.scatter_add_(1, saved->local_target, saved->in_shard.mul(scale).neg_().unsqueeze(1));
    saved->probs = at::Tensor();
    return g;
  };
  const at::Tensor loss = dtensor::differentiable(x, forward, backward, "vocab_parallel_ce");
  return loss;
}

}  // namespace hyperpar::parallel
