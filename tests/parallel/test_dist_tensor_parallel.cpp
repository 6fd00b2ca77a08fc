// Tensor-parallel parity on 8 real ranks: a 2-layer Transformer (dense, and with an MoE layer
// with a shared expert) with TP=2 and TP=4 (the other mesh dim replicates), with and without
// sequence parallel and loss parallel, against the single-process model built on every rank.
//   * init identity: every gathered parameter equals the single-process init bit for bit;
//   * the loss and every gathered gradient match within 1e-5 relative (fp32; sharded
//     matmuls and reductions sum in a different order, which measured ~1e-7 here).
// And the vocab-parallel cross entropy alone against at::cross_entropy_loss on whole logits.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/comm/world.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/parallel/loss_parallel.h"
#include "hyperpar/parallel/tensor_parallel.h"
#include "tp_test_models.h"

using namespace hyperpar;

namespace {

constexpr uint64_t kSeed = 1234;

struct Batch {
  at::Tensor tokens, targets;
};
Batch batch(int64_t vocab) {
  at::Tensor all = at::arange(2 * 9, at::kLong).reshape({2, 9}).mul(7).remainder(vocab);
  return {all.narrow(1, 0, 8).contiguous(), all.narrow(1, 1, 8).contiguous()};
}

void check_parity(bool moe, int64_t tp_size, bool sp, bool loss_parallel = false) {
  auto world = comm::World::from_env();
  const auto cfg = test_models::tiny_config(moe);
  const Batch b = batch(cfg.vocab_size);
  // Single-process reference (every rank computes it alone).
  models::Transformer ref(cfg);
  ref.init_weights(kSeed);
  at::Tensor ref_loss = models::Transformer::loss(ref(b.tokens), b.targets);
  ref_loss.backward();

  auto mesh = mesh::DeviceMesh::init(world, {8 / tp_size, tp_size}, {"dp", "tp"});
  models::Transformer model(cfg);
  parallel::parallelize_module(
      model, mesh["tp"],
      parallel::transformer_tp_plan(cfg.n_heads, cfg.n_kv_heads, /*has_dense=*/true, moe,
                                    cfg.shared_expert, tp_size, sp, /*moe_experts=*/true,
                                    loss_parallel));
  model.init_weights(kSeed);
  at::Tensor logits = model(b.tokens);
  at::Tensor loss = loss_parallel ? parallel::vocab_parallel_cross_entropy(
                                        logits, b.targets, mesh["tp"], cfg.vocab_size)
                                  : models::Transformer::loss(logits, b.targets);
  if (loss_parallel) {
    EXPECT_EQ(logits.size(-1), cfg.vocab_size / tp_size) << "logits not left split";
  }
  loss.backward();
  const std::string what = std::string(moe ? "moe" : "dense") + " tp=" + std::to_string(tp_size) +
                           (sp ? " sp" : "") + (loss_parallel ? " loss_parallel" : "");
  EXPECT_LE(test_models::rel_diff(loss, ref_loss), 1e-5)
      << what << " loss " << loss.item<float>() << " vs " << ref_loss.item<float>();
  double max_rd = 0;
  auto ref_params = ref.named_parameters();
  auto params = model.named_parameters();
  ASSERT_EQ(params.size(), ref_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    ASSERT_EQ(name, ref_params[i].first);
    ASSERT_TRUE(p->spec.has_value()) << name;
    at::Tensor full = dtensor::DTensor(p->data.detach(), *p->spec).full_tensor();
    EXPECT_TRUE(full.equal(ref_params[i].second->data)) << what << " init of " << name;
    ASSERT_TRUE(p->data.grad().defined()) << what << " no grad for " << name;
    dtensor::DTensorSpec gspec(p->spec->mesh(), dtensor::normalized_for_grad(p->spec->placements()),
                               p->shape);
    at::Tensor gfull = dtensor::DTensor(p->data.grad(), gspec).full_tensor();
    const double rd = test_models::rel_diff(gfull, ref_params[i].second->data.grad());
    max_rd = std::max(max_rd, rd);
    EXPECT_LE(rd, 1e-5) << what << " grad of " << name << " (" << p->placements_string() << ")";
  }
  if (world->rank() == 0)
    std::cout << what << ": loss " << loss.item<float>() << ", loss rel diff "
              << test_models::rel_diff(loss, ref_loss) << ", max grad rel diff " << max_rd << "\n";
}

// Whole logits [2, 5, vocab] (the same seeded values on every rank) and their targets, some
// of them ignore_index (-100); each tp rank takes its torch.chunk of the vocabulary.
void check_vocab_parallel_cross_entropy(int64_t tp_size, int64_t vocab, c10::ScalarType dtype) {
  auto world = comm::World::from_env();
  auto mesh = mesh::DeviceMesh::init(world, {8 / tp_size, tp_size}, {"dp", "tp"});
  const int64_t coord = (*mesh["tp"].get_coordinate())[0];
  at::manual_seed(7);
  const at::Tensor whole = (at::randn({2, 5, vocab}) * 3).to(dtype);
  at::Tensor targets = at::randint(vocab, {2, 5}, at::kLong);
  targets[0][1] = -100;
  targets[1][4] = -100;
  targets[1][0] = vocab - 1;  // the last shard's last entry
  const at::Tensor ref_in = whole.clone().requires_grad_(true);
  const at::Tensor ref = models::Transformer::loss(ref_in, targets);
  ref.backward();
  const auto range = dtensor::chunk_range(vocab, tp_size, coord);
  const at::Tensor local = whole.narrow(-1, range.start, range.size).clone().requires_grad_(true);
  const at::Tensor loss = parallel::vocab_parallel_cross_entropy(local, targets, mesh["tp"], vocab);
  loss.backward();
  const std::string what = "tp=" + std::to_string(tp_size) + " vocab " + std::to_string(vocab) +
                           " " + c10::toString(dtype);
  // fp32 sums in another order: ~1e-7; bf16 gradients round to 8 bits (2^-8 relative).
  const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
  EXPECT_LE(test_models::rel_diff(loss, ref), 1e-6)
      << what << " loss " << loss.item<float>() << " vs " << ref.item<float>();
  ASSERT_TRUE(local.grad().defined()) << what;
  EXPECT_EQ(local.grad().scalar_type(), dtype) << what;
  const at::Tensor ref_grad = ref_in.grad().narrow(-1, range.start, range.size);
  EXPECT_LE(test_models::rel_diff(local.grad().to(at::kFloat), ref_grad.to(at::kFloat)), tol)
      << what << " gradient of tp rank " << coord;
  // Rows whose target is ignored get no gradient at all.
  EXPECT_EQ(local.grad()[0][1].abs().max().item<float>(), 0.0f) << what;
}

}  // namespace

TEST(DistTensorParallel, VocabParallelCrossEntropyMatchesWholeLogits) {
  check_vocab_parallel_cross_entropy(2, 64, at::kFloat);
  check_vocab_parallel_cross_entropy(4, 37, at::kFloat);  // chunks 10, 10, 10, 7
  check_vocab_parallel_cross_entropy(4, 64, at::kBFloat16);
}

// A rank whose logits are not its chunk of the vocabulary fails on every rank before any
// communication, saying what it got and expected.
TEST(DistTensorParallel, VocabParallelCrossEntropyRejectsLogitsOfTheWrongWidth) {
  auto world = comm::World::from_env();
  auto mesh = mesh::DeviceMesh::init(world, {4, 2}, {"dp", "tp"});
  const at::Tensor logits = at::zeros({3, 64});  // whole, not this rank's 32
  try {
    parallel::vocab_parallel_cross_entropy(logits, at::zeros({3}, at::kLong), mesh["tp"], 64);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("64 vocabulary entries, expected 32"), std::string::npos)
        << e.what();
  }
}

TEST(DistTensorParallel, DenseTp2) { check_parity(false, 2, false); }
TEST(DistTensorParallel, DenseTp2LossParallel) { check_parity(false, 2, false, true); }
TEST(DistTensorParallel, MoeTp4SequenceParallelLossParallel) { check_parity(true, 4, true, true); }
TEST(DistTensorParallel, DenseTp4) { check_parity(false, 4, false); }
TEST(DistTensorParallel, MoeTp2) { check_parity(true, 2, false); }
TEST(DistTensorParallel, MoeTp4) { check_parity(true, 4, false); }
TEST(DistTensorParallel, DenseTp2SequenceParallel) { check_parity(false, 2, true); }
TEST(DistTensorParallel, MoeTp4SequenceParallel) { check_parity(true, 4, true); }
