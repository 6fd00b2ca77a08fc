#pragma once
// Loss parallel: the cross entropy of logits that stay split over the vocabulary on the tp
// mesh (the output head's ColwiseParallel with output layout Shard(-1)), as PyTorch's
// loss_parallel and Megatron's vocab-parallel cross entropy compute it. The whole logits are
// never gathered: each tp rank reduces its vocabulary shard to three numbers per row (the
// max, the sum of exponentials and the target's logit where this shard holds the target)
// and all-reduces those, 3 floats per row instead of (tp-1)/tp of the row's logits.
//
//   tp = 2, vocab 4096, 512 rows: rank 0 holds logits[:, 0:2048], rank 1 logits[:, 2048:4096]
//   m    = all_reduce_max(rowmax(local))                       [512]
//   S, T = all_reduce_sum(rowsum(exp(local - m)), local[target] or 0)   [2 x 512]
//   loss = mean(log S + m - T)          (the same value on both ranks)
//   dlocal = (exp(local - m) / S - onehot(target in this shard)) * dloss / rows
//
// The backward needs no communication; the head's input gradient is all-reduced by its
// ColwiseParallel as before. Rows whose target is `ignore_index` count for nothing, as in
// at::cross_entropy_loss (the mean is over the other rows). The arithmetic is
// nn/cross_entropy.h's fused cross entropy, with these all-reduces as its combine steps.
#include <ATen/core/Tensor.h>

#include <string>

#include "hyperpar/mesh/device_mesh.h"

namespace hyperpar::parallel {

/// Mean cross entropy of the logits whose last dim is split over the 1-D mesh `tp` as
/// torch.chunk splits `vocab_size` (`local_logits`: this rank's chunk, [..., chunk]) against
/// `targets` (the same on every tp rank, [...], global vocabulary ids). Computed in float32
/// whatever the logits' dtype. Collective over `tp`; every tp rank gets the same loss. Its
/// all-reduces count under the traffic scope "tp output".
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        const mesh::DeviceMesh& tp, int64_t vocab_size,
                                        int64_t ignore_index = -100);

}  // namespace hyperpar::parallel
