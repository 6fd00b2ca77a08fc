// Tensor-parallel parity on 8 real ranks: a 2-layer Transformer (dense, and with an MoE layer
// with a shared expert) with TP=2 and TP=4 (the other mesh dim replicates), with and without
// sequence parallel, against the single-process model built on every rank.
//   * init identity: every gathered parameter equals the single-process init bit for bit;
//   * the loss and every gathered gradient match within 1e-5 relative (fp32; sharded
//     matmuls and reductions sum in a different order, which measured ~1e-7 here).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/comm/world.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"
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

void check_parity(bool moe, int64_t tp_size, bool sp) {
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
                                    cfg.shared_expert, tp_size, sp));
  model.init_weights(kSeed);
  at::Tensor loss = models::Transformer::loss(model(b.tokens), b.targets);
  loss.backward();
  const std::string what =
      std::string(moe ? "moe" : "dense") + " tp=" + std::to_string(tp_size) + (sp ? " sp" : "");
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

}  // namespace

TEST(DistTensorParallel, DenseTp2) { check_parity(false, 2, false); }
TEST(DistTensorParallel, DenseTp4) { check_parity(false, 4, false); }
TEST(DistTensorParallel, MoeTp2) { check_parity(true, 2, false); }
TEST(DistTensorParallel, MoeTp4) { check_parity(true, 4, false); }
TEST(DistTensorParallel, DenseTp2SequenceParallel) { check_parity(false, 2, true); }
TEST(DistTensorParallel, MoeTp4SequenceParallel) { check_parity(true, 4, true); }
