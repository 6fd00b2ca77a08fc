// nn layers and the Module system in one process: the documented maths, hooks, FQNs,
// meta build + to_empty + init_weights, and the error for a forward on meta parameters.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "hyperpar/core/device_context.h"
#include "hyperpar/core/error.h"
#include "hyperpar/models/transformer.h"

using namespace hyperpar;

namespace {
models::TransformerConfig small_moe() {
  models::TransformerConfig c;
  c.vocab_size = 32;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 24;
  c.n_experts = 4;
  c.top_k = 2;
  c.moe_layers = {1};
  c.shared_expert = true;
  return c;
}
}  // namespace

TEST(Layers, LinearAndRmsNormMatchTheirFormulas) {
  nn::Linear lin(5, 3, true);
  lin.init_weights(7);
  at::Tensor x = at::randn({2, 5});
  at::Tensor w = lin.param("weight").data, b = lin.param("bias").data;
  EXPECT_TRUE(at::allclose(lin(x), at::matmul(x, w.t()) + b));
  // Default Linear init: U(+-1/sqrt(in)).
  EXPECT_LE(w.abs().max().item<float>(), 1 / std::sqrt(5.0f));
  nn::RMSNorm norm(4, 1e-5);
  norm.init_weights(0);  // ones
  at::Tensor y = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 4});
  const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f + 1e-5f);
  EXPECT_TRUE(at::allclose(norm(y), y / rms));
}

TEST(Layers, RotaryRotatesInterleavedPairs) {
  // One head of dim 4 at positions 0 and 1: pair 0 rotates by p * 1, pair 1 by p * 100^-1.
  at::Tensor x = at::tensor({1.0f, 0.0f, 1.0f, 0.0f}).view({1, 1, 1, 4}).expand({1, 2, 1, 4});
  at::Tensor r = nn::apply_rotary(x.contiguous(), 10000.0);
  EXPECT_TRUE(r[0][0].equal(x[0][0]));  // position 0: no rotation
  EXPECT_NEAR(r[0][1][0][0].item<float>(), std::cos(1.0), 1e-6);
  EXPECT_NEAR(r[0][1][0][1].item<float>(), std::sin(1.0), 1e-6);
  EXPECT_NEAR(r[0][1][0][2].item<float>(), std::cos(0.01), 1e-6);
  EXPECT_NEAR(r[0][1][0][3].item<float>(), std::sin(0.01), 1e-6);
}

TEST(Layers, AttentionIsCausal) {
  auto init = dtensor::InitScheme::normal(0, 0.2);
  nn::Attention attn(16, 4, 2, 10000.0, init, init);
  attn.init_weights(3);
  at::Tensor x = at::randn({1, 6, 16});
  at::Tensor y = attn(x);
  at::Tensor x2 = x.clone();
  x2[0][5] += 1.0;  // change the last token only
  at::Tensor y2 = attn(x2);
  EXPECT_TRUE(at::allclose(y.narrow(1, 0, 5), y2.narrow(1, 0, 5)));
  EXPECT_FALSE(at::allclose(y.narrow(1, 5, 1), y2.narrow(1, 5, 1)));
}

TEST(Layers, MoeMatchesAPerTokenLoop) {
  auto init = dtensor::InitScheme::normal(0, 0.3);
  nn::MoE moe(8, 12, 4, 2, /*shared=*/true, init, init);
  moe.init_weights(11);
  at::Tensor x = at::randn({1, 5, 8});
  at::Tensor y = moe(x);
  at::Tensor t = x.view({5, 8});
  nn::Routing r = moe.route(t);
  EXPECT_TRUE(at::allclose(r.weights.sum(-1), at::ones({5})));
  for (int64_t i = 0; i < 5; ++i) {
    at::Tensor want = (*moe.shared_expert)(t[i].unsqueeze(0))[0];
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t e = r.experts[i][j].item<int64_t>();
      want = want + r.weights[i][j] * moe.experts->run_expert(e, t[i].unsqueeze(0))[0];
    }
    EXPECT_TRUE(at::allclose(y[0][i], want, 1e-5, 1e-6)) << i;
  }
}

TEST(ModuleSystem, NamesHooksAndApply) {
  models::Transformer model(small_moe());
  std::vector<std::string> names;
  for (auto& [n, p] : model.named_parameters()) names.push_back(n);
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  for (const char* n : {"tok_embeddings.weight", "layers.0.attention.wq.weight",
                        "layers.0.feed_forward.w2.weight", "layers.1.moe.router.weight",
                        "layers.1.moe.experts.w1", "layers.1.moe.shared_expert.w3.weight",
                        "layers.1.ffn_norm.weight", "norm.weight", "output.weight"})
    EXPECT_TRUE(has(n)) << n;
  int64_t count = 0;
  for (auto& [n, p] : model.named_parameters()) count += p->data.numel();
  EXPECT_EQ(count, model.cfg.num_parameters());
  int modules = 0;
  model.apply([&](const std::string&, nn::Module&) { ++modules; });
  EXPECT_EQ(modules, static_cast<int>(model.named_modules().size()));
  // Hooks replace input and output.
  nn::Linear lin(2, 2);
  lin.add_forward_pre_hook([](nn::Module&, const at::Tensor& x) { return x * 0; });
  lin.add_forward_hook([](nn::Module&, const at::Tensor&, const at::Tensor& y) { return y + 5; });
  EXPECT_TRUE(lin(at::ones({1, 2})).equal(at::full({1, 2}, 5.0f)));
}

TEST(ModuleSystem, MetaBuildThenMaterialize) {
  models::Transformer cpu_model(small_moe());
  cpu_model.init_weights(42);
  std::shared_ptr<models::Transformer> meta_model;
  {
    DeviceContext meta(c10::kMeta);
    meta_model = std::make_shared<models::Transformer>(small_moe());
  }
  at::Tensor tokens = at::zeros({1, 4}, at::kLong);
  try {
    (*meta_model)(tokens);
    ADD_FAILURE() << "forward on meta parameters did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("tok_embeddings.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("layers.1.moe.experts.w2"), std::string::npos) << m;
  }
  EXPECT_THROW(meta_model->init_weights(42), Error);
  meta_model->to_empty(c10::kCPU);
  meta_model->init_weights(42);
  auto a = cpu_model.named_parameters(), b = meta_model->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(a[i].second->data.equal(b[i].second->data)) << a[i].first;
  EXPECT_TRUE((*meta_model)(tokens).equal(cpu_model(tokens)));
}
