// FSDP prefetch on 8 ranks: a forward prefetch issued by group A is consumed by group B's
// unshard; if B's shard changes in between (an optimizer step, an in-place edit), the stale
// buffer is dropped and B gathers again, so B always computes with its current weights.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <optional>

#include "hyperpar/parallel/fsdp.h"

using namespace hyperpar;

namespace {

class SumOfWeights : public nn::Module {
 public:
  SumOfWeights() : Module("SumOfWeights") {
    register_parameter("w", {8}, dtensor::InitScheme::normal(0, 1));
  }
  at::Tensor forward(const at::Tensor& x) override { return x + value("w").sum(); }
};

struct Pair {
  SumOfWeights a, b;
  at::Tensor full_b;  // B's unsharded init
  std::optional<parallel::FSDPHandle> ha, hb;
  explicit Pair(const mesh::DeviceMesh& dp) {
    a.init_weights(1);
    b.init_weights(2);
    full_b = b.param("w").data.detach().clone();
    ha = parallel::fully_shard(a, dp);
    hb = parallel::fully_shard(b, dp);
    ha->set_modules_to_forward_prefetch({*hb});
  }
};

}  // namespace

TEST(FsdpPrefetch, ConsumedWhenCurrent) {
  auto dp = mesh::DeviceMesh::init(comm::World::from_env(), {8}, {"dp"});
  Pair p(dp);
  at::Tensor x = at::zeros({1});
  p.a(x);
  const double got = p.b(x).item<double>();
  EXPECT_EQ(p.hb->stats().prefetched, 1);
  EXPECT_EQ(p.hb->stats().all_gathers, 1);
  EXPECT_NEAR(got, p.full_b.sum().item<double>(), 1e-5);
}

TEST(FsdpPrefetch, StaleBufferIsGatheredAgain) {
  auto dp = mesh::DeviceMesh::init(comm::World::from_env(), {8}, {"dp"});
  Pair p(dp);
  at::Tensor x = at::zeros({1});
  p.a(x);  // issues B's all-gather
  {
    at::NoGradGuard no_grad;
    p.b.param("w").data.add_(1.0);  // every rank's one element of w changes after the issue
  }
  const double got = p.b(x).item<double>();
  EXPECT_EQ(p.hb->stats().prefetched, 0);
  EXPECT_EQ(p.hb->stats().all_gathers, 2);  // the prefetch (dropped) and a fresh one
  EXPECT_NEAR(got, p.full_b.sum().item<double>() + 8.0, 1e-5);
}
