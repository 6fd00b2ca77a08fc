#include "hyperpar/nn/layers.h"

#include <ATen/ATen.h>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/fused_ops.h"

namespace hyperpar::nn {

Linear::Linear(int64_t in, int64_t out, bool bias)
    : Linear(in, out, bias, dtensor::InitScheme::linear_default(in)) {}

Linear::Linear(int64_t in, int64_t out, bool bias, dtensor::InitScheme weight_init)
    : Module("Linear"), in_features(in), out_features(out) {
  register_parameter("weight", {out, in}, weight_init);
  if (bias) register_parameter("bias", {out}, dtensor::InitScheme::linear_default(in));
}

at::Tensor Linear::weight_for(const at::Tensor& x) const {
  at::Tensor w = value("weight");
  HP_CHECK(x.size(-1) == w.size(1), "Linear: input last dim ", x.size(-1),
           " does not match the local weight ", w.sizes(), " (in_features ", in_features, ")");
  return w;
}

at::Tensor Linear::forward(const at::Tensor& x) {
  const at::Tensor w = weight_for(x);
  at::Tensor y = at::matmul(x, w.t());
  if (reduce_output) y = reduce_output(y);
  if (has_param("bias")) y = y + value("bias");
  return y;
}

Embedding::Embedding(int64_t num, int64_t dim)
    : Module("Embedding"), num_embeddings(num), embedding_dim(dim) {
  register_parameter("weight", {num, dim}, dtensor::InitScheme::embedding_default());
}

at::Tensor Embedding::forward(const at::Tensor& ids) {
  at::Tensor w = value("weight");
  const bool rows_split = w.size(0) != num_embeddings;
  const int64_t row0 = vocab_start;
  at::Tensor y;
  if (!rows_split) {
    y = at::embedding(w, ids);
  } else {
    at::Tensor local_ids = ids - row0;
    at::Tensor outside = (local_ids < 0).logical_or(local_ids >= w.size(0));
    y = at::embedding(w, local_ids.masked_fill(outside, 0));
    y = y.masked_fill(outside.unsqueeze(-1), 0.0);
  }
  if (reduce_output) y = reduce_output(y);
  return y;
}

RMSNorm::RMSNorm(int64_t dim, double eps_) : Module("RMSNorm"), eps(eps_) {
  register_parameter("weight", {dim}, dtensor::InitScheme::ones());
}

at::Tensor RMSNorm::forward(const at::Tensor& x) { return rms_norm(x, value("weight"), eps); }

}  // namespace hyperpar::nn
