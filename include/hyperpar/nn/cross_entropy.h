#pragma once
// Fused cross entropy: mean over rows of log(sum exp(logits)) - logits[target], in float32,
// with one autograd node whose backward turns exp(logits - max) (kept from the forward) into
// the gradient in place: softmax - onehot(target), scaled. Against log_softmax + nll_loss it
// writes no log-probabilities, no zero-filled one-hot gradient and no second gradient
// buffer (4 passes over the logits fewer per step; ~2.5% of a one-process step of
// bench/peer's model, whose logits are 32 MB).
//
// The vocabulary may be split over ranks (loss parallel, parallel/loss_parallel.h): the
// logits are then the columns [start, start + width) and `combine_max` / `combine_sums`
// reduce the per-row partial results over the ranks holding the other columns:
//
//   m    = combine_max(rowmax(logits))                                   [rows]
//   S, T = combine_sums(rowsum(exp(logits - m)), logits[target] or 0)    [2, rows]
//   loss = mean over counted rows of log S + m - T
//   dlogits = (exp(logits - m) / S - onehot(target in these columns)) * dloss / counted rows
//
// Rows whose target is `ignore_index` count for nothing (at::cross_entropy_loss's mean).
// A second backward through the same loss (retain_graph, as zero-bubble pipelines do)
// recomputes exp(logits - m) from the logits, which the node keeps for that.
#include <ATen/core/Tensor.h>

#include <functional>

namespace hyperpar::nn {

struct VocabColumns {
  int64_t start = 0;   // vocabulary id of the first column of these logits
  int64_t vocab = -1;  // whole vocabulary size, for the target check; -1: the logits' width
                       // when whole, no upper bound when split
  /// In-place reductions over the ranks holding the other columns; empty: the logits are
  /// the whole vocabulary.
  std::function<void(at::Tensor& row_max)> combine_max;
  std::function<void(at::Tensor& sums)> combine_sums;
};

/// Mean cross entropy of `logits` [..., width] against `targets` [...] (vocabulary ids).
at::Tensor fused_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                               const VocabColumns& columns = {}, int64_t ignore_index = -100);

}  // namespace hyperpar::nn
