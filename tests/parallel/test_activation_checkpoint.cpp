// Activation checkpointing in one process: the modes parse (and bad ones name the key); a
// checkpointed block runs its forward again in backward (full, every:K) while selective
// recomputes only inside blocks; and losses and every gradient are bit-identical to no
// checkpointing, for a dense+MoE model directly and through the trainer (FSDP on a 1-rank
// world, 3 steps of AdamW).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/comm/world.h"
#include "hyperpar/core/error.h"
#include "hyperpar/parallel/activation_checkpoint.h"
#include "hyperpar/train/trainer.h"

using namespace hyperpar;
using parallel::ActivationCheckpoint;

namespace {

models::TransformerConfig moe_model() {
  models::TransformerConfig c;
  c.vocab_size = 32;
  c.dim = 16;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 24;
  c.n_experts = 4;
  c.moe_layers = {1, 2};
  c.shared_expert = true;
  return c;
}

struct Result {
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> grads;
  std::vector<int> block_forwards;
};

Result forward_backward(const std::string& mode) {
  models::Transformer m(moe_model());
  m.init_weights(11);
  parallel::apply_activation_checkpoint(m, parallel::parse_activation_checkpoint(mode, "ac"));
  Result r;
  r.block_forwards.assign(m.layers.size(), 0);
  for (size_t i = 0; i < m.layers.size(); ++i)
    m.layers[i]->add_forward_hook([&r, i](nn::Module&, const at::Tensor&, const at::Tensor& y) {
      ++r.block_forwards[i];
      return y;
    });
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(32, {3, 10}, at::kLong);
  const at::Tensor targets = at::randint(32, {3, 10}, at::kLong);
  r.loss = models::Transformer::loss(m(tokens), targets);
  r.loss.backward();
  for (auto& [n, p] : m.named_parameters()) r.grads.emplace_back(n, p->data.grad().clone());
  return r;
}

}  // namespace

TEST(ActivationCheckpoint, ParsesModesAndNamesTheKeyOnBadOnes) {
  EXPECT_EQ(parallel::parse_activation_checkpoint("every:3", "k").to_string(), "every:3");
  for (const char* ok : {"none", "full", "selective"})
    EXPECT_EQ(parallel::parse_activation_checkpoint(ok, "k").to_string(), ok);
  for (const char* bad : {"every:0", "every:", "every:x", "Full", "sometimes"}) {
    try {
      parallel::parse_activation_checkpoint(bad, "parallel.activation_checkpoint");
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.activation_checkpoint must be none, full, "
                                           "every:K (K >= 1) or selective"),
                std::string::npos);
    }
  }
}

TEST(ActivationCheckpoint, EveryModeIsBitIdenticalAndRecomputesWhatItSays) {
  const Result none = forward_backward("none");
  EXPECT_EQ(none.block_forwards, (std::vector<int>{1, 1, 1, 1}));
  const std::map<std::string, std::vector<int>> forwards = {
      {"full", {2, 2, 2, 2}}, {"every:2", {2, 1, 2, 1}}, {"selective", {1, 1, 1, 1}}};
  for (const auto& [mode, expected] : forwards) {
    const Result r = forward_backward(mode);
    EXPECT_EQ(r.block_forwards, expected) << mode;
    EXPECT_TRUE(at::equal(r.loss, none.loss)) << mode;
    ASSERT_EQ(r.grads.size(), none.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i)
      EXPECT_TRUE(at::equal(r.grads[i].second, none.grads[i].second))
          << mode << ": " << r.grads[i].first;
  }
}

// Through the trainer: FSDP (1-rank world, meta init, bf16 parameters so that the group
// gathers and reduces rather than keeping fp32 leaves) unshards each block again for its
// recomputation; three AdamW steps give exactly the losses and grad norms of none.
TEST(ActivationCheckpoint, TrainerStepsAreBitIdenticalWithFsdp) {
  auto steps = [](const std::string& mode) {
    auto world = comm::World::simulated(0, 1);
    train::Config c = train::load_config(std::string(HYPERPAR_SOURCE_DIR) + "/configs/single.yaml",
                                         {"train.steps=3", "parallel.param_dtype=bfloat16",
                                          "parallel.activation_checkpoint=" + mode});
    train::validate(c, 1);
    auto pm = train::build_parallel_model(c, world);
    auto res = train::run_training(c, pm, *world, "", false);
    std::vector<double> out;
    for (const auto& s : res.steps) {
      out.push_back(s.loss);
      out.push_back(s.grad_norm);
    }
    return out;
  };
  const auto none = steps("none");
  for (const char* mode : {"full", "every:2", "selective"}) EXPECT_EQ(steps(mode), none) << mode;
}
