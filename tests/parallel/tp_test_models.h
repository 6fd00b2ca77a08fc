#pragma once
// Small model configs shared by the tensor-parallel tests.
#include "hyperpar/models/transformer.h"

namespace hyperpar::test_models {

inline models::TransformerConfig tiny_config(bool moe) {
  models::TransformerConfig c;
  c.vocab_size = 64;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.ffn_hidden = 48;
  if (moe) {
    c.n_experts = 4;
    c.top_k = 2;
    c.moe_layers = {1};
    c.shared_expert = true;
  }
  return c;
}

/// Relative difference ||a - b|| / max(||b||, tiny), in double.
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double nb = b.to(at::kDouble).norm().item<double>();
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / std::max(nb, 1e-30);
}

}  // namespace hyperpar::test_models
