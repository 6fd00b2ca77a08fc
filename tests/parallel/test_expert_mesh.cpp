// Expert-parallel meshes and specs in one process (simulated 8-rank world):
//   * the worked example of parallel/expert_mesh.h, built under DeviceContext(meta), for
//     expert_tp = 1 and expert_tp = tp;
//   * regression (a) with EP: build_parallel_model (experts Shard(0) on ep, TP, fully_shard
//     per experts group / block / root) runs entirely under meta and gives the expert weights
//     combined (efsdp, ep[, tp]) specs with StridedShard;
//   * a forward with parameters still on meta raises, naming exactly those parameters;
//   * materialised on every simulated rank, the shards assemble the single-process init bit
//     for bit, with experts FSDP-sharded on dim 0 (including ranks that hold no expert rows:
//     torch.chunk sizes 1,1,0,0) or on dim 1 (plain, or strided where tp splits dim 1 too);
//   * expert_fsdp_shard_dim picks the dim without padding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/core/device_context.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/parallel/expert_mesh.h"
#include "hyperpar/train/parallel_model.h"

using namespace hyperpar;

namespace {

using Ranks = std::vector<int64_t>;

mesh::DeviceMesh world_mesh(int64_t rank) {
  return mesh::DeviceMesh::init(comm::World::simulated(rank, 8), {1, 4, 2},
                                {"dp_replicate", "dp_shard", "tp"});
}

train::Config ep_config(const std::vector<std::string>& sets) {
  train::Config c =
      train::load_config(std::string(HYPERPAR_SOURCE_DIR) + "/configs/tp2_ep2_fsdp.yaml", sets);
  train::validate(c, 8);
  return c;
}

// The same model on one rank (the reference layout).
train::Config single_config() {
  train::Config c = ep_config({});
  c.parallel = train::ParallelConfig{};
  train::validate(c, 1);
  return c;
}

// The message of the error a forward raises ("" and a test failure when it raises none).
std::string forward_error(nn::Module& model) {
  try {
    model(at::zeros({1, 4}, at::kLong));
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the forward raised no error";
  return "";
}

}  // namespace

TEST(ExpertMesh, WorkedExampleExpertTp1) {
  DeviceContext meta(c10::kMeta);
  auto m = parallel::make_expert_meshes(world_mesh(5), 2, 1);
  EXPECT_EQ(m.ep.dim_names(), (std::vector<std::string>{"ep"}));
  EXPECT_EQ(m.ep.ranks(), (Ranks{4, 5}));
  EXPECT_EQ(m.expert_dp.ranks(), (Ranks{1, 3, 5, 7}));
  std::vector<Ranks> ep_groups;
  for (int64_t r = 0; r < 8; r += 2)
    ep_groups.push_back(parallel::make_expert_meshes(world_mesh(r), 2, 1).ep.ranks());
  EXPECT_EQ(ep_groups, (std::vector<Ranks>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.gradient_divide_factor, 4.0);
}

TEST(ExpertMesh, WorkedExampleExpertTpEqualsTp) {
  DeviceContext meta(c10::kMeta);
  auto m = parallel::make_expert_meshes(world_mesh(5), 2, 2);
  EXPECT_EQ(m.ep.dim_names(), (std::vector<std::string>{"ep", "tp"}));
  EXPECT_EQ(m.ep.ranks(), (Ranks{4, 5, 6, 7}));
  EXPECT_EQ(m.ep.group_ranks(0), (Ranks{5, 7}));
  EXPECT_EQ(m.expert_dp.ranks(), (Ranks{1, 5}));
}

TEST(ExpertMesh, HsdpAndBadSizes) {
  auto w = mesh::DeviceMesh::init(comm::World::simulated(6, 8), {2, 2, 2},
                                  {"dp_replicate", "dp_shard", "tp"});
  auto m = parallel::make_expert_meshes(w, 2, 1);
  EXPECT_EQ(m.expert_dp.dim_names(), (std::vector<std::string>{"dp_replicate", "efsdp"}));
  EXPECT_EQ(m.expert_dp.ranks(), (Ranks{0, 2, 4, 6}));
  EXPECT_EQ(m.ep.ranks(), (Ranks{6, 7}));
  EXPECT_EQ(m.gradient_divide_factor, 4.0);
  EXPECT_THROW(parallel::make_expert_meshes(world_mesh(0), 3, 1), Error);
  EXPECT_THROW(parallel::make_expert_meshes(world_mesh(0), 8, 2), Error);
  EXPECT_THROW(parallel::make_expert_meshes(world_mesh(0), 2, 3), Error);
}

// The FSDP shard dim the trainer picks (torchtitan's rule for experts, for every parameter):
// dim 0 when it divides over the shard ranks, else the dim that pads least.
TEST(ExpertMesh, LeastPaddedDimAvoidsPadding) {
  EXPECT_EQ(parallel::least_padded_dim({2, 704, 512}, 4), 1);
  EXPECT_EQ(parallel::least_padded_dim({4, 704, 512}, 4), 0);
  EXPECT_EQ(parallel::least_padded_dim({8, 704, 512}, 4), 0);
  EXPECT_EQ(parallel::least_padded_dim({2, 7, 512}, 4), 2);  // 512 divides: no padding
  EXPECT_EQ(parallel::least_padded_dim({2, 7, 6}, 4), 1);    // 2x8x6 < 4x7x6 and 2x7x8
  EXPECT_EQ(parallel::least_padded_dim({3, 2, 6}, 4), 0);    // 4x2x6 vs 3x4x6 vs 3x2x8: a tie
  EXPECT_EQ(parallel::least_padded_dim({4, 512}, 8), 1);     // a router on 8 ranks
  EXPECT_EQ(parallel::least_padded_dim({1, 64}, 1), 0);
  EXPECT_EQ(parallel::least_padded_dim({3}, 2), 0);  // one dim: nothing else to shard
  EXPECT_THROW(parallel::least_padded_dim({}, 2), Error);
}

// Every expert FSDP layout built under meta and materialised on 8 simulated ranks assembles
// the single-process init bit for bit; the configurations differ in the expert weights' specs:
//   expert_tp 1, auto: 2 local experts over 4 efsdp ranks -> dim 1 (no padding);
//   expert_tp 1, dim 0 forced: StridedShard(0) with ranks holding no expert rows (1,1,0,0);
//   expert_tp 2, auto: 2 local experts over 2 efsdp ranks -> dim 0;
//   expert_tp 2, dim 1 forced: w1's dim 1 is split by tp too -> StridedShard(1, sf=2).
TEST(ExpertMesh, SpecsUnderMetaAndInitIdentity) {
  // Single-process reference init.
  auto ref = train::build_parallel_model(single_config(), comm::World::simulated(0, 1));
  std::map<std::string, at::Tensor> want;
  for (auto& [n, p] : ref.model->named_parameters()) want[n] = p->data.detach();

  struct Layout {
    std::string expert_tp, shard_dim, w1_placements;
    std::vector<std::string> mesh_dims;
    Ranks rank5_w1_shape;
    dtensor::IndexRanges rank5_w1_rows;  // of dim 1
  };
  const std::vector<Layout> layouts = {
      {"1", "auto", "(Shard(1), Shard(0))", {"efsdp", "ep"}, {2, 16, 64}, {{32, 16}}},
      {"1", "0", "(StridedShard(0, sf=2), Shard(0))", {"efsdp", "ep"}, {0, 64, 64}, {{0, 64}}},
      {"2",
       "auto",
       "(StridedShard(0, sf=2), Shard(0), Shard(1))",
       {"efsdp", "ep", "tp"},
       {1, 32, 64},
       {{32, 32}}},
      {"2",
       "1",
       "(StridedShard(1, sf=2), Shard(0), Shard(1))",
       {"efsdp", "ep", "tp"},
       {2, 16, 64},
       {{48, 16}}},
  };
  for (const Layout& l : layouts) {
    const std::string what = "expert_tp " + l.expert_tp + ", expert_shard_dim " + l.shard_dim;
    std::map<std::string, at::Tensor> got;
    for (auto& [n, w] : want) got[n] = at::full(w.sizes(), std::nanf(""));
    for (int64_t r = 0; r < 8; ++r) {
      train::Config c = ep_config(
          {"parallel.expert_tp=" + l.expert_tp, "parallel.expert_shard_dim=" + l.shard_dim});
      // Regression (a): everything up to fully_shard runs under meta.
      auto pm = train::build_parallel_model(c, comm::World::simulated(r, 8), false);
      auto& w1 = pm.model->layers[1]->moe->experts->param("w1");
      ASSERT_TRUE(w1.data.is_meta());
      ASSERT_TRUE(w1.spec);
      EXPECT_EQ(dtensor::to_string(w1.spec->placements()), l.w1_placements) << what;
      EXPECT_EQ(w1.spec->mesh().dim_names(), l.mesh_dims) << what;
      if (r == 5) {
        // Worked example of expert_mesh.h: rank 5 is efsdp 2, ep 1 (expert_tp 1) or efsdp 1,
        // ep 0, tp 1 (expert_tp 2).
        EXPECT_EQ(w1.data.sizes().vec(), l.rank5_w1_shape) << what;
        EXPECT_EQ(w1.local_ranges()[1], l.rank5_w1_rows) << what;
      }
      auto& wq = pm.model->layers[0]->attention->wq->param("weight");
      EXPECT_EQ(dtensor::to_string(wq.spec->placements()), "(StridedShard(0, sf=2), Shard(0))");
      // Materialise this rank's shards and place them in the full tensors.
      pm.model->to_empty(c10::kCPU);
      pm.model->init_weights(c.train.seed);
      for (auto& [n, p] : pm.model->named_parameters())
        dtensor::put_ranges(got[n], p->local_ranges(), p->data.detach());
    }
    for (auto& [n, w] : want) EXPECT_TRUE(got[n].equal(w)) << what << ": " << n;
  }
}

TEST(ExpertMesh, ForwardWithMetaParametersNamesThem) {
  // Not materialised at all (EP + TP + FSDP specs set under meta): the forward refuses before
  // any communication and lists the parameters.
  auto pm = train::build_parallel_model(ep_config({}), comm::World::simulated(0, 8), false);
  const std::string all = forward_error(*pm.model);
  EXPECT_NE(all.find("layers.1.moe.experts.w1"), std::string::npos) << all;
  EXPECT_NE(all.find("tok_embeddings.weight"), std::string::npos) << all;
  // One parameter left on meta after materialising the rest: only it is named.
  auto one = train::build_parallel_model(single_config(), comm::World::simulated(0, 1));
  auto& w = one.model->layers[0]->attention->wo->param("weight");
  w.data = at::empty(w.data.sizes(), at::TensorOptions().device(c10::kMeta)).requires_grad_(true);
  const std::string just_wo = forward_error(*one.model);
  EXPECT_NE(just_wo.find("layers.0.attention.wo.weight"), std::string::npos) << just_wo;
  EXPECT_EQ(just_wo.find("layers.0.attention.wq.weight"), std::string::npos) << just_wo;
}
