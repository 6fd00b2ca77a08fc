// Shard-consistent init on simulated worlds: every rank of a layout initialises only its
// block, the blocks are assembled in one process, and the result equals the unsharded
// init bit for bit (plain placements, nested and strided shards, and a whole TP Transformer).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../parallel/tp_test_models.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/dtensor/random.h"
#include "hyperpar/parallel/tensor_parallel.h"

using namespace hyperpar;
using namespace hyperpar::dtensor;

TEST(InitIdentity, EveryLayoutAssemblesTheUnshardedInit) {
  const std::vector<std::vector<int64_t>> shapes = {{10, 7}, {5, 3, 4}, {3, 2}};
  const std::vector<Placements> layouts = {{Shard{0}, Shard{1}},
                                           {Shard{0}, Shard{0}},
                                           {StridedShard{0, 4}, Shard{0}},
                                           {Replicate{}, Shard{1}},
                                           {Shard{1}, Replicate{}}};
  const std::vector<InitScheme> schemes = {InitScheme::normal(0, 1), InitScheme::uniform(-1, 2),
                                           InitScheme::trunc_normal(0.1, 0.5, -0.3, 0.6),
                                           InitScheme::ones()};
  for (const auto& shape : shapes)
    for (const auto& scheme : schemes) {
      at::Tensor want = at::empty(shape);
      std::vector<IndexRanges> all;
      for (int64_t n : shape) all.push_back({{0, n}});
      init_shard(want, shape, all, scheme, 99, stream_of("w"));
      for (const auto& p : layouts) {
        at::Tensor got = at::full(shape, std::nanf(""));
        for (int64_t r = 0; r < 8; ++r) {
          auto mesh = mesh::DeviceMesh::init(comm::World::simulated(r, 8), {2, 4}, {"a", "b"});
          DTensorSpec spec(mesh, p, shape);
          at::Tensor local = at::empty(spec.local_shape());
          init_shard(local, shape, spec.local_ranges(), scheme, 99, stream_of("w"));
          put_ranges(got, spec.local_ranges(), local);
        }
        EXPECT_TRUE(got.equal(want)) << to_string(p) << " " << scheme.to_string();
      }
    }
}

TEST(InitIdentity, DistributionsAndStreams) {
  at::Tensor t = at::empty({200000});
  init_shard(t, {200000}, {{{0, 200000}}}, InitScheme::normal(0, 1), 5, stream_of("a"));
  // mean of 2e5 N(0,1) draws: standard error 0.0022, so 0.01 is > 4 sigma.
  EXPECT_NEAR(t.mean().item<float>(), 0.0, 0.01);
  EXPECT_NEAR(t.std().item<float>(), 1.0, 0.01);
  at::Tensor u = at::empty({200000});
  init_shard(u, {200000}, {{{0, 200000}}}, InitScheme::trunc_normal(0, 1, -0.5, 1.0), 5,
             stream_of("a"));
  EXPECT_GE(u.min().item<float>(), -0.5f);
  EXPECT_LE(u.max().item<float>(), 1.0f);
  at::Tensor v = at::empty({200000});
  init_shard(v, {200000}, {{{0, 200000}}}, InitScheme::normal(0, 1), 5, stream_of("b"));
  EXPECT_FALSE(v.equal(t));  // other parameter name, other values
  // Known answer of the Philox-4x32-10 reference (Random123 kat_vectors): counter and key 0.
  auto z = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
}

TEST(InitIdentity, TensorParallelTransformerOnEveryRank) {
  for (bool moe : {false, true})
    for (int64_t tp : {2, 4}) {
      const auto cfg = test_models::tiny_config(moe);
      models::Transformer ref(cfg);
      ref.init_weights(77);
      std::map<std::string, at::Tensor> assembled;
      for (auto& [n, p] : ref.named_parameters()) assembled[n] = at::full(p->shape, std::nanf(""));
      for (int64_t r = 0; r < 8; ++r) {
        auto mesh =
            mesh::DeviceMesh::init(comm::World::simulated(r, 8), {8 / tp, tp}, {"dp", "tp"});
        models::Transformer m(cfg);
        parallel::parallelize_module(
            m, mesh["tp"],
            parallel::transformer_tp_plan(cfg.n_heads, cfg.n_kv_heads, true, moe, cfg.shared_expert,
                                          tp, false));
        m.init_weights(77);
        for (auto& [n, p] : m.named_parameters())
          put_ranges(assembled[n], p->local_ranges(), p->data.detach());
      }
      for (auto& [n, p] : ref.named_parameters())
        EXPECT_TRUE(assembled[n].equal(p->data)) << n << " tp=" << tp << " moe=" << moe;
    }
}
