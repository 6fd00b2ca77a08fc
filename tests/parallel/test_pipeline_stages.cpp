// Pipeline stages in one process: the layer split (default and explicit, with its errors),
// each rank building only its part of the model under the whole model's names with the same
// initial values, and running the stages in turn equals the whole model's forward.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "hyperpar/core/device_context.h"
#include "hyperpar/core/error.h"
#include "hyperpar/models/transformer.h"
#include "hyperpar/parallel/pipeline/stage_split.h"

using namespace hyperpar;
using namespace hyperpar::parallel::pipeline;

namespace {

std::string ranges(const std::vector<StageLayers>& s) {
  std::string out;
  for (const auto& st : s)
    out += "[" + std::to_string(st.first) + "," + std::to_string(st.end) + ")" +
           (st.embedding ? "e" : "") + (st.head ? "h" : "");
  return out;
}

std::string error_of(int64_t layers, int64_t stages, const std::vector<int64_t>& firsts) {
  try {
    split_layers(layers, stages, firsts);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

models::TransformerConfig small_moe() {
  models::TransformerConfig c;
  c.vocab_size = 32;
  c.dim = 16;
  c.n_layers = 5;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 24;
  c.n_experts = 4;
  c.moe_layers = {1, 3};
  return c;
}

}  // namespace

TEST(PipelineStages, DefaultSplitIsEvenWithEmbeddingFirstAndHeadLast) {
  EXPECT_EQ(ranges(split_layers(10, 4, {})), "[0,2)e[2,5)[5,7)[7,10)h");
  EXPECT_EQ(ranges(split_layers(8, 8, {})), "[0,1)e[1,2)[2,3)[3,4)[4,5)[5,6)[6,7)[7,8)h");
  EXPECT_EQ(ranges(split_layers(3, 1, {})), "[0,3)eh");
  EXPECT_EQ(ranges(split_layers(10, 4, {0, 3, 6, 8})), "[0,3)e[3,6)[6,8)[8,10)h");
  // Rank 1 of pp 2 with 2 virtual stages holds stages 1 and 3.
  EXPECT_EQ(layers_of_rank(split_layers(8, 4, {}), 1, 2), (std::vector<int64_t>{2, 3, 6, 7}));
}

TEST(PipelineStages, BadSplitsNameTheValues) {
  EXPECT_NE(error_of(3, 4, {}).find("3 layers cannot fill 4 stages"), std::string::npos);
  EXPECT_NE(error_of(10, 4, {0, 3, 6})
                .find("lists 3 first layers [0, 3, 6]; expected one per "
                      "stage (4)"),
            std::string::npos);
  EXPECT_NE(error_of(10, 2, {1, 5}).find("must start at layer 0"), std::string::npos);
  EXPECT_NE(error_of(10, 3, {0, 5, 5}).find("strictly increasing"), std::string::npos);
  EXPECT_NE(error_of(10, 2, {0, 10}).find("below n_layers 10"), std::string::npos);
}

// Two pipeline ranks of a 5-layer MoE model (stages [0,2) and [2,5)) built on meta and
// materialised: names are the whole model's, values equal its (counter-based init), and
// stage 0 then stage 1 gives the whole model's logits.
TEST(PipelineStages, PartsHoldTheirLayersUnderWholeModelNamesAndComposeExactly) {
  const auto cfg = small_moe();
  const auto split = split_layers(cfg.n_layers, 2, {});
  models::Transformer whole(cfg);
  whole.init_weights(3);
  std::vector<std::shared_ptr<models::Transformer>> parts;
  for (int64_t r = 0; r < 2; ++r) {
    models::ModelPart part{layers_of_rank(split, r, 2), r == 0, r == 1};
    {
      DeviceContext meta(c10::kMeta);
      parts.push_back(std::make_shared<models::Transformer>(cfg, part));
    }
    parts.back()->to_empty(c10::kCPU);
    parts.back()->init_weights(3);
  }
  auto whole_params = whole.named_parameters();
  size_t n = 0;
  for (auto& part : parts)
    for (auto& [name, p] : part->named_parameters()) {
      ++n;
      bool found = false;
      for (auto& [wn, wp] : whole_params)
        if (wn == name) {
          found = true;
          EXPECT_TRUE(at::equal(p->data, wp->data)) << name;
        }
      EXPECT_TRUE(found) << name;
    }
  EXPECT_EQ(n, whole_params.size());
  EXPECT_EQ(parts[0]->layer_ids, (std::vector<int64_t>{0, 1}));
  EXPECT_FALSE(parts[0]->norm);
  EXPECT_FALSE(parts[1]->tok_embeddings);
  EXPECT_TRUE(parts[1]->layer(3).moe);
  EXPECT_THROW(parts[1]->layer(0), Error);
  EXPECT_THROW((*parts[1])(at::zeros({1, 4}, at::kLong)), Error);  // not the whole model

  const at::Tensor tokens = at::randint(cfg.vocab_size, {2, 6}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor h = parts[0]->forward_stage(0, 2, true, false, tokens);
  EXPECT_EQ(h.sizes().vec(), (std::vector<int64_t>{2, 6, cfg.dim}));
  const at::Tensor logits = parts[1]->forward_stage(2, 5, false, true, h);
  EXPECT_TRUE(at::equal(logits, whole(tokens)));
}
