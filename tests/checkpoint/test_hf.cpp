// Hugging Face conversion in one process: names, the rotary row order, config.json both
// ways and the architectures refused. (transformers itself checks the results in
// tests/checkpoint/test_hf_interop.sh.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

#include "common/temp_dir.h"
#include "hyperpar/checkpoint/hf_config.h"
#include "hyperpar/checkpoint/hf_names.h"
#include "hyperpar/core/error.h"

using namespace hyperpar;

namespace {

models::TransformerConfig mixtral_like() {
  models::TransformerConfig c;
  c.vocab_size = 128;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 48;
  c.n_experts = 4;
  c.top_k = 2;
  c.moe_layers = {0, 1};
  c.norm_eps = 1e-6;
  c.rope_theta = 500000;
  return c;
}

std::string refusal(const models::TransformerConfig& c) {
  try {
    checkpoint::hf_architecture(c);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string read_error(const std::string& dir, const std::string& json) {
  std::ofstream(dir + "/config.json") << json;
  try {
    checkpoint::read_hf_config(dir);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HFNames, RotaryRowsPermuteInsideEachHead) {
  // head_dim 4, two heads: hyperpar rows [a0 a1 a2 a3 | b0 b1 b2 b3] are HF rows
  // [a0 a2 a1 a3 | b0 b2 b1 b3] (pair i = rows 2i, 2i+1 -> rows i, i + 2).
  at::Tensor w = at::arange(8, at::kFloat).view({8, 1});
  at::Tensor hf = checkpoint::rotary_rows_to_hf(w, 4);
  EXPECT_TRUE(at::equal(hf.view(-1), at::tensor({0, 2, 1, 3, 4, 6, 5, 7}, at::kFloat)));
  EXPECT_TRUE(at::equal(checkpoint::rotary_rows_from_hf(hf, 4), w));
  at::Tensor big = at::randn({64, 5});
  EXPECT_TRUE(
      at::equal(checkpoint::rotary_rows_from_hf(checkpoint::rotary_rows_to_hf(big, 16), 16), big));
}

TEST(HFNames, EveryParameterHasAnHFName) {
  const auto c = mixtral_like();
  using K = checkpoint::HFTensorRef::Kind;
  auto q = checkpoint::hf_tensor_of("layers.1.attention.wq.weight", c);
  EXPECT_EQ(q.name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q.kind, K::kRotaryRows);
  EXPECT_EQ(q.head_dim, 8);
  EXPECT_EQ(checkpoint::hf_tensor_of("layers.0.attention.wv.weight", c).kind, K::kPlain);
  auto e = checkpoint::hf_tensor_of("layers.0.moe.experts.w2", c);
  EXPECT_EQ(e.kind, K::kExperts);
  EXPECT_EQ(e.expert(3), "model.layers.0.block_sparse_moe.experts.3.w2.weight");
  EXPECT_EQ(checkpoint::hf_tensor_of("layers.0.moe.router.weight", c).name,
            "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(checkpoint::hf_tensor_of("layers.0.feed_forward.w3.weight", c).name,
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(checkpoint::hf_tensor_of("output.weight", c).name, "lm_head.weight");
  EXPECT_THROW(checkpoint::hf_tensor_of("layers.0.moe.shared_expert.w1.weight", c), UsageError);
  // Every parameter of both architectures maps.
  for (auto cfg : {c, models::TransformerConfig{}}) {
    models::Transformer m(cfg);
    for (auto& [fqn, p] : m.named_parameters())
      EXPECT_NO_THROW(checkpoint::hf_tensor_of(fqn, cfg)) << fqn;
  }
}

TEST(HFConfig, WrittenConfigReadsBackAsTheSameModel) {
  hyperpar::testing::TempDir tmp;
  for (auto c : {mixtral_like(), models::TransformerConfig{}}) {
    std::ofstream(tmp.path + "/config.json") << checkpoint::hf_config_json(c, "float32");
    const auto hf = checkpoint::read_hf_config(tmp.path);
    EXPECT_EQ(hf.architecture, c.n_experts ? "MixtralForCausalLM" : "LlamaForCausalLM");
    EXPECT_EQ(hf.model.dim, c.dim);
    EXPECT_EQ(hf.model.n_kv_heads, c.n_kv_heads);
    EXPECT_EQ(hf.model.ffn_hidden, c.ffn_hidden);
    EXPECT_EQ(hf.model.norm_eps, c.norm_eps);
    EXPECT_EQ(hf.model.rope_theta, c.rope_theta);
    EXPECT_EQ(hf.model.moe_layers, c.moe_layers);
    EXPECT_EQ(hf.model.n_experts, c.n_experts);
    EXPECT_FALSE(hf.tie_word_embeddings);
  }
}

TEST(HFConfig, ArchitecturesNoHFModelMatchesAreRefusedWithTheReason) {
  auto c = mixtral_like();
  c.shared_expert = true;
  EXPECT_NE(refusal(c).find("shared_expert_gate"), std::string::npos);
  c = mixtral_like();
  c.moe_layers = {1};
  EXPECT_NE(refusal(c).find("layers [0] are dense among MoE layers"), std::string::npos)
      << refusal(c);
  EXPECT_EQ(refusal(mixtral_like()), "");
}

TEST(HFConfig, UnsupportedConfigsAreRefused) {
  hyperpar::testing::TempDir tmp;
  const std::string base =
      R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2)";
  EXPECT_EQ(read_error(tmp.path, "{\"model_type\": \"llama\", " + base + "}"), "");
  // transformers 5's nested rope settings.
  EXPECT_EQ(read_error(tmp.path,
                       "{\"model_type\": \"llama\", " + base +
                           R"(, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}})"),
            "");
  EXPECT_EQ(checkpoint::read_hf_config(tmp.path).model.rope_theta, 5e5);
  EXPECT_NE(read_error(tmp.path, "{\"model_type\": \"qwen2\", " + base + "}").find("qwen2"),
            std::string::npos);
  EXPECT_NE(read_error(tmp.path, "{\"model_type\": \"llama\", " + base +
                                     R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8}})")
                .find("scaled rope"),
            std::string::npos);
  EXPECT_NE(
      read_error(tmp.path, "{\"model_type\": \"llama\", \"attention_bias\": true, " + base + "}")
          .find("attention_bias"),
      std::string::npos);
  EXPECT_NE(read_error(tmp.path, "{\"model_type\": \"llama\", \"head_dim\": 16, " + base + "}")
                .find("head_dim 16"),
            std::string::npos);
  EXPECT_NE(read_error(tmp.path,
                       "{\"model_type\": \"mixtral\", \"num_local_experts\": 4, "
                       "\"sliding_window\": 4096, " +
                           base + "}")
                .find("sliding_window"),
            std::string::npos);
  EXPECT_NE(
      read_error(tmp.path, "{\"model_type\": \"llama\", \"hidden_size\": 32}").find("missing"),
      std::string::npos);
}
