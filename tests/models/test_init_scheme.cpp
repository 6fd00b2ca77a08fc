// The initialisation models/transformer.h documents: bounds and standard deviations.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "hyperpar/models/transformer.h"

using namespace hyperpar;

TEST(InitScheme, WeightsFollowTheDocumentedDistributions) {
  models::TransformerConfig c;
  c.vocab_size = 512;
  c.dim = 128;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 256;
  c.n_experts = 4;
  c.moe_layers = {2};
  models::Transformer m(c);
  m.init_weights(3);
  for (auto& [fqn, p] : m.named_parameters()) {
    const at::Tensor w = p->data;
    const double max = w.abs().max().item<double>(), std = w.std().item<double>();
    double want_std = 0.02, bound = 0.04;
    const auto layer = fqn.rfind("layers.", 0) == 0 ? std::stoi(fqn.substr(7)) : -1;
    const bool residual_out =
        fqn.find("wo.") != std::string::npos || fqn.find("w2") != std::string::npos;
    if (fqn.find("norm") != std::string::npos) {
      EXPECT_TRUE(at::all(w == 1).item<bool>()) << fqn;
      continue;
    }
    if (fqn == "tok_embeddings.weight") {
      EXPECT_NEAR(std, 1.0, 0.02) << fqn;
      continue;
    }
    if (fqn == "output.weight") {
      want_std = 1 / std::sqrt(128.0);
      bound = 3 * want_std;
    } else if (residual_out) {
      want_std = 0.02 / std::sqrt(2.0 * (layer + 1));
      bound = 2 * want_std;
    }
    // A normal truncated at +-2 std has std 0.88 of the untruncated one; at +-3, 0.986.
    const double shrink = fqn == "output.weight" ? 0.986 : 0.880;
    EXPECT_LE(max, bound * (1 + 1e-6)) << fqn;
    EXPECT_GT(max, bound * 0.9) << fqn;  // the truncation is reached: it is not a narrower law
    // Tolerance: +-8%, several standard errors for the smallest tensors (4096 elements).
    EXPECT_NEAR(std / (want_std * shrink), 1.0, 0.08) << fqn;
  }
}
