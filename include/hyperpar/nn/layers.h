#pragma once
// Basic layers: Linear, Embedding, RMSNorm (maths exactly as PyTorch's; documented per class).
// Each reads its weights through Module::value(), so parallel styles can distribute them.
#include <functional>

#include "hyperpar/nn/module.h"

namespace hyperpar::nn {

using TensorFn = std::function<at::Tensor(const at::Tensor&)>;

/// y = x W^T (+ b), W: [out, in]. Default init as torch.nn.Linear: U(+-1/sqrt(in)).
/// When the weight is split on `in` (rowwise TP), each rank's product is a partial sum:
/// `reduce_output` (set by RowwiseParallel) reduces it before the bias is added once.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = false);
  Linear(int64_t in, int64_t out, bool bias, dtensor::InitScheme weight_init);
  at::Tensor forward(const at::Tensor& x) override;
  /// The weight forward uses, checked against the input's last dim (a clear error otherwise).
  at::Tensor weight_for(const at::Tensor& x) const;
  TensorFn reduce_output;
  int64_t in_features, out_features;
};

/// y = W[ids], W: [num, dim], init N(0, 1) as torch.nn.Embedding. With the rows split
/// (vocab-parallel TP) a rank looks up only ids in its row range and outputs zeros for the
/// rest, a partial sum that `reduce_output` reduces.
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  at::Tensor forward(const at::Tensor& ids) override;
  TensorFn reduce_output;
  int64_t num_embeddings, embedding_dim;
  int64_t vocab_start = 0;  // first row this rank holds when the rows are split (set by TP)
};

/// y = x * rsqrt(mean(x^2 over the last dim) + eps) * w, computed in float32 and cast back
/// to x's dtype (as Llama's reference). w init ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x) override;
  double eps;
};

}  // namespace hyperpar::nn
