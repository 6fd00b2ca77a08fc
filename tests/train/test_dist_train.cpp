// The reported configurations end to end on 8 real ranks, against the single-rank baseline
// (configs/single.yaml run in-process on a 1-rank world by every rank):
//   * TP=2+FSDP, HSDP(2x2)+TP=2, FSDP=8: 20 steps with meta init; every step's loss within
//     1e-5 relative of the baseline, so is every step's global gradient norm, and the final
//     full weights are within 1e-5 (relative L2 per parameter). fp32; differences come only from
//     summation order (measured ~1e-7).
//   * TP=2+EP=2+FSDP (experts whole on ep, or split over tp too), EP=2+FSDP, HSDP+TP+EP with
//     sequence parallel, TP=4+EP=2 without reshard: the same 20-step comparison.
//   * every run also evaluates every 5 steps: val_loss (fixed validation batches, no
//     gradients) matches the baseline's within the same tolerance, on every layout, and
//     evaluating changes nothing in training;
//   * micro_batches=4 equals one big batch; bf16 params (fp32 reduce) within 1e-2 of fp32.
//   * communication count per step; regression (a) fully_shard under meta with TP params
//     (combined meshes and StridedShard) and (b) a non-contiguous gradient view handed to the
//     Communicator raises synchronously naming the parameter.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/train_run.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"
#include "hyperpar/parallel/expert_parallel.h"
#include "hyperpar/train/trainer.h"

using namespace hyperpar;
using namespace hyperpar::test;

TEST(DistTrain, Tp2Fsdp) {
  expect_matches(run("tp2_fsdp.yaml", {}, true), baseline(), 1e-5, "tp2_fsdp");
}

TEST(DistTrain, Tp2Ep2Fsdp) {
  expect_matches(run("tp2_ep2_fsdp.yaml", {}, true), baseline(), 1e-5, "tp2_ep2_fsdp");
}

TEST(DistTrain, Ep2FsdpNoPrefetch) {
  expect_matches(run("ep2_fsdp.yaml", {"parallel.prefetch=false"}, true), baseline(), 1e-5,
                 "ep2_fsdp (no prefetch)");
}

TEST(DistTrain, Tp2Ep2FsdpReshardToTwoRanks) {
  train::ParallelModel pm;
  expect_matches(run("tp2_ep2_fsdp.yaml", {"parallel.reshard_after_forward=2"}, true, &pm),
                 baseline(), 1e-5, "tp2_ep2_fsdp reshard_after_forward=2");
  // Every refill (one per group per step) ran within the 2-rank group; the last block (and its
  // experts) and the root stay unsharded after forward (FSDP2's root, torchtitan's last
  // block), so they have none.
  for (auto& h : pm.fsdp) {
    const bool kept = h.fqns().front().rfind("layers.1.", 0) == 0 || &h == &pm.fsdp.back();
    EXPECT_EQ(h.stats().post_forward_group_gathers, kept ? 0 : 20) << h.fqns().front();
  }
}

TEST(DistTrain, Tp2Ep2FsdpExpertsSplitOverTp) {
  expect_matches(run("tp2_ep2_fsdp.yaml", {"parallel.expert_tp=2"}, true), baseline(), 1e-5,
                 "tp2_ep2_fsdp expert_tp=2");
}

// Expert FSDP on the dim the automatic choice does not take: dim 0 with padding (2 local
// experts over 4 ranks, two of which hold none) and dim 1 split by tp too (StridedShard(1)).
TEST(DistTrain, Tp2Ep2FsdpExpertShardDims) {
  expect_matches(run("tp2_ep2_fsdp.yaml", {"parallel.expert_shard_dim=0"}, true), baseline(), 1e-5,
                 "tp2_ep2_fsdp expert_shard_dim=0");
  expect_matches(
      run("tp2_ep2_fsdp.yaml", {"parallel.expert_tp=2", "parallel.expert_shard_dim=1"}, true),
      baseline(), 1e-5, "tp2_ep2_fsdp expert_tp=2 expert_shard_dim=1");
}

TEST(DistTrain, HsdpTp2Ep2SequenceParallel) {
  expect_matches(run("tp2_ep2_fsdp.yaml",
                     {"parallel.dp_replicate=2", "parallel.sequence_parallel=true"}, true),
                 baseline(), 1e-5, "hsdp2_tp2_ep2 sp");
}

TEST(DistTrain, Tp4Ep2NoReshard) {
  // ep < tp (ep groups inside tp groups) and experts unsharded between forward and backward.
  expect_matches(
      run("tp2_ep2_fsdp.yaml",
          {"parallel.tp=4", "parallel.ep=2", "parallel.reshard_after_forward=false"}, true),
      baseline(), 1e-5, "tp4_ep2 no reshard");
}

TEST(DistTrain, HsdpTp2) {
  expect_matches(run("hsdp2_tp2.yaml", {}, true), baseline(), 1e-5, "hsdp2_tp2");
}

TEST(DistTrain, Fsdp8NoReshard) {
  expect_matches(
      run("tp2_fsdp.yaml", {"parallel.tp=1", "parallel.reshard_after_forward=false"}, true),
      baseline(), 1e-5, "fsdp8");
}

// Two 6-step runs of tp2_ep2_fsdp.yaml (block groups per parameter, expert groups on dim 1,
// StridedShard: per group) differing only in `key` (value a, then b), kept in pa and pb; their
// losses, gradient norms and final weights must be bit-identical.
static void expect_bit_identical_with(const std::string& key, const char* a, const char* b,
                                      train::ParallelModel* pa, train::ParallelModel* pb) {
  const std::vector<std::string> sets{"train.steps=6", "parallel.expert_tp=2",
                                      "parallel.expert_shard_dim=1"};
  auto with = [&](const char* v) {
    auto s = sets;
    s.push_back(key + "=" + v);
    return s;
  };
  const auto ra = run("tp2_ep2_fsdp.yaml", with(a), true, pa);
  const auto rb = run("tp2_ep2_fsdp.yaml", with(b), true, pb);
  ASSERT_EQ(ra.losses.size(), rb.losses.size());
  for (size_t s = 0; s < ra.losses.size(); ++s) {
    EXPECT_EQ(ra.losses[s], rb.losses[s]) << key << ", step " << s + 1;
    EXPECT_EQ(ra.grad_norms[s], rb.grad_norms[s]) << key << ", step " << s + 1;
  }
  for (const auto& [n, w] : ra.weights)
    EXPECT_TRUE(at::equal(w, rb.weights.at(n))) << key << ", " << n;
}

// Per-parameter collectives (the default where every parameter splits evenly on dim 0)
// and per-group ones move the same values: training is bit-identical, on a layout where
// block groups go per parameter and the expert groups (dim 1, StridedShard) per group.
TEST(DistTrain, PerParamAndPerGroupCollectivesTrainIdentically) {
  train::ParallelModel per_param, per_group;
  expect_bit_identical_with("parallel.fsdp_collectives", "per_param", "per_group", &per_param,
                            &per_group);
  int direct = 0, flat = 0;
  for (auto& h : per_param.fsdp) (h.stats().per_param_collectives ? direct : flat)++;
  EXPECT_GT(direct, 0) << "no group went per parameter";
  EXPECT_GT(flat, 0) << "the dim-1 expert groups must stay per group";
  for (auto& h : per_group.fsdp) EXPECT_FALSE(h.stats().per_param_collectives) << h.fqns().front();
}

// Host-shared unsharded parameters (the default on one host) and private ones move the same
// values: training is bit-identical, with prefetch, resharding after forward and the backward
// refills; every group takes the window, the per-parameter block groups and the dim-1 expert
// groups (StridedShard, flat reductions) alike, and writes its shard once per step (after
// each optimizer step), not once per gather.
TEST(DistTrain, HostSharedAndPrivateUnshardTrainIdentically) {
  train::ParallelModel shared, apart;
  expect_bit_identical_with("parallel.fsdp_host_shared", "true", "false", &shared, &apart);
  int strided = 0;
  for (auto& h : shared.fsdp) {
    const auto& st = h.stats();
    EXPECT_TRUE(st.host_shared_params) << h.fqns().front();
    if (!st.per_param_collectives) ++strided;
    // 6 steps and an evaluation (2 batches) after step 5: the shards change 6 times as seen
    // by the gathers (initial values, then after each of 5 optimizer steps), so 6 writes out
    // of a forward gather per step and batch (and a backward refill per step where the group
    // reshards after forward: all but the root and the last block).
    EXPECT_GE(st.all_gathers, 8) << h.fqns().front();
    EXPECT_EQ(st.host_window_writes, 6) << h.fqns().front();
  }
  EXPECT_GT(strided, 0) << "the dim-1 expert groups must be among them";
  for (auto& h : apart.fsdp) EXPECT_FALSE(h.stats().host_shared_params) << h.fqns().front();
}

TEST(DistTrain, GradientAccumulationEqualsOneBigBatch) {
  expect_matches(
      run("tp2_ep2_fsdp.yaml",
          {"train.micro_batches=4", "train.global_batch_size=16", "train.steps=5"}, true),
      run("tp2_ep2_fsdp.yaml", {"train.global_batch_size=16", "train.steps=5"}, true), 1e-5,
      "micro_batches=4");
}

TEST(DistTrain, Bf16ParamsWithinOnePercent) {
  const TrainRun bf = run("tp2_ep2_fsdp.yaml", {"parallel.param_dtype=bfloat16"}, true);
  EXPECT_LE(std::abs(bf.losses.back() - baseline().losses.back()), 1e-2)
      << bf.losses.back() << " vs " << baseline().losses.back();
  if (comm::World::from_env()->rank() == 0)
    std::cout << "bf16: last loss " << bf.losses.back() << " vs fp32 " << baseline().losses.back()
              << "\n";
}

TEST(DistTrain, LossFallsOverTraining) {
  const TrainRun r = run("tp2_ep2_fsdp.yaml", {"train.steps=100"}, true);
  EXPECT_LT(r.losses.back(), 0.6 * r.losses.front())
      << r.losses.front() << " -> " << r.losses.back();
  if (comm::World::from_env()->rank() == 0)
    std::cout << "100 steps: loss " << r.losses.front() << " -> " << r.losses.back() << "\n";
}

TEST(DistTrain, ExpertParallelCountsAndSpecs) {
  train::ParallelModel pm;
  const TrainRun r = run("tp2_ep2_fsdp.yaml", {"train.steps=1"}, true, &pm);
  // Groups: block 0, block 1, layer 1's experts (expert-FSDP mesh), root.
  ASSERT_EQ(pm.fsdp.size(), 4u);
  EXPECT_EQ(pm.fsdp[2].fqns().front(), "layers.1.moe.experts.w1");
  for (auto& h : pm.fsdp) {
    // Block 0 is resharded after forward and gathered again for backward; the last block, its
    // experts and the root stay unsharded (FSDP2's root, torchtitan's last block).
    const bool block0 = &h == &pm.fsdp.front();
    EXPECT_EQ(h.stats().all_gathers, block0 ? 2 : 1) << h.fqns().front();
    EXPECT_EQ(h.stats().reduce_scatters, 1) << h.fqns().front();
    EXPECT_EQ(h.stats().all_reduces, 0) << h.fqns().front();
    // Prefetch chains: root -> block 0 -> block 1 -> experts (forward), root -> block 1 ->
    // experts -> block 0 (backward): every group but the root is prefetched in forward, and
    // block 0's refill in backward (kept groups have none).
    EXPECT_EQ(h.stats().prefetched, &h == &pm.fsdp.back() ? 0 : block0 ? 2 : 1) << h.fqns().front();
  }
  // Regression (a) on real ranks: expert specs combined from the expert-FSDP and ep meshes;
  // one step equals the baseline's first step.
  EXPECT_LE(rel(r.losses[0], baseline().losses[0]), 1e-6);
  auto& w1 = pm.model->layers[1]->moe->experts->param("w1");
  // 2 local experts over 4 expert-FSDP ranks: sharded on dim 1 (no padding).
  EXPECT_EQ(dtensor::to_string(w1.spec->placements()), "(Shard(1), Shard(0))");
  const at::Tensor full = dtensor::DTensor(w1.data.detach(), *w1.spec).full_tensor();
  train::ParallelModel one;
  run("single.yaml", {"train.steps=1"}, false, &one);
  EXPECT_LE(rel_t(full, one.model->layers[1]->moe->experts->param("w1").data.detach()), 1e-6);
}

TEST(DistTrain, CommunicationCountsAndRegressions) {
  train::ParallelModel pm;
  run("tp2_fsdp.yaml", {"train.steps=1"}, true, &pm);
  // (a) built under meta: TP params got combined (dp_shard, tp) meshes and StridedShard.
  auto& wq = pm.model->layers[0]->attention->wq->param("weight");
  EXPECT_EQ(dtensor::to_string(wq.spec->placements()), "(StridedShard(0, sf=2), Shard(0))");
  EXPECT_EQ(wq.spec->mesh().dim_names(), (std::vector<std::string>{"dp_shard", "tp"}));
  auto& wo = pm.model->layers[0]->attention->wo->param("weight");
  EXPECT_EQ(dtensor::to_string(wo.spec->placements()), "(Shard(0), Shard(1))");
  // Counts for one step: 3 groups (2 blocks + root), reshard_after_forward: block 0 is
  // gathered in forward and again before backward; the last block and the root stay
  // unsharded after forward (one gather); one reduce-scatter each.
  ASSERT_EQ(pm.fsdp.size(), 3u);
  for (auto& h : pm.fsdp) {
    const bool block0 = &h == &pm.fsdp.front();
    EXPECT_EQ(h.stats().all_gathers, block0 ? 2 : 1) << h.fqns().front();
    EXPECT_EQ(h.stats().reduce_scatters, 1) << h.fqns().front();
    EXPECT_EQ(h.stats().all_reduces, 0);
    EXPECT_EQ(h.stats().prefetched, &h == &pm.fsdp.back() ? 0 : block0 ? 2 : 1) << h.fqns().front();
  }
  // (b) the gradient of a TP Shard(1) weight handed as a transposed view straight to the
  // Communicator: synchronous ContractError naming the parameter.
  at::Tensor g = at::randn({wo.data.size(1), wo.data.size(0)}).t();
  ASSERT_FALSE(g.is_contiguous());
  auto group = pm.dp_mesh->get_group(0);
  at::Tensor out = at::empty({g.numel() / group->size()});
  try {
    group->reduce_scatter_tensor(out, g, comm::ReduceOp::kAvg, {"layers.0.attention.wo.weight"});
    ADD_FAILURE() << "no error";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attention.wo.weight"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("not contiguous"), std::string::npos) << e.what();
  }
}

// FSDP's flat all-gather and reduce-scatter buffers are allocated once per group (send and
// receive of each) and reused by every later step, prefetch and refill included; per
// parameter (float32 parameters, no cast) only the reduce-scatter's receive buffer exists:
// each all-gather reads its shard directly. Expert
// parallel's receive buffers (rows and gradients, both ways) are taken once per step each
// and allocated again only when a step's routing brings more rows than any step before
// (with a quarter of headroom): on this config's fixed seed at most once after the first
// step on any rank, so at most 2 allocations for 6 to 8 takes.
TEST(DistTrain, FsdpAndExpertExchangeBuffersAreReusedAcrossSteps) {
  train::ParallelModel pm;
  const int64_t steps = 6;
  run("tp2_ep2_fsdp.yaml", {"train.steps=" + std::to_string(steps)}, true, &pm);
  const int64_t eval_forwards = 2;  // run() evaluates every 5 steps, 2 batches
  for (auto& h : pm.fsdp) {
    // Forward + refill every step for block 0; forward only for the kept groups.
    EXPECT_EQ(h.stats().all_gathers, (&h == &pm.fsdp.front() ? 2 * steps : steps) + eval_forwards)
        << h.fqns().front();
    // Per parameter: the reduced shards; flat: gather send and receive (not host-shared:
    // the window is its gather buffer) and reduce send and receive.
    const auto& st = h.stats();
    EXPECT_EQ(st.buffer_allocations, st.per_param_collectives ? 1
                                     : st.host_shared_params  ? 2
                                                              : 4)
        << h.fqns().front();
    // Every reduced shard became its gradient without a copy (float32 throughout), and the
    // receive buffer was still reused (above): the step's zero_grad let go of the views.
    EXPECT_EQ(st.grads_viewing_buffer, steps * static_cast<int64_t>(h.fqns().size()))
        << h.fqns().front();
  }
  int moe_layers = 0;
  for (auto& [fqn, m] : pm.model->named_modules()) {
    auto* moe = dynamic_cast<nn::MoE*>(m);
    if (!moe) continue;
    ++moe_layers;
    const auto buffers = parallel::exchange_buffers(*moe);
    ASSERT_NE(buffers, nullptr) << fqn;
    const std::vector<const ReusedBuffer*> forward{buffers->dispatch.get(), buffers->combine.get()},
        backward{buffers->dispatch_grad.get(), buffers->combine_grad.get()};
    for (const auto* b : forward) EXPECT_EQ(b->takes(), steps + eval_forwards) << fqn;
    for (const auto* b : backward) EXPECT_EQ(b->takes(), steps) << fqn;
    for (const auto* b : forward) EXPECT_LE(b->allocations(), 2) << fqn;
    for (const auto* b : backward) EXPECT_LE(b->allocations(), 2) << fqn;
  }
  EXPECT_EQ(moe_layers, 1);
}

namespace {

// One in-process run with the communication report on; rank 0 gets the report's JSON.
nlohmann::json comm_report_of(const std::string& config, const std::vector<std::string>& sets) {
  auto world = comm::World::from_env();
  train::Config c = train::load_config(cfg_path(config), sets);
  train::validate(c, world->size());
  auto pm = train::build_parallel_model(c, world);
  train::TrainOptions o;
  o.print = false;
  o.comm_report = true;
  const auto res = train::run_training(c, pm, *world, o);
  for (const auto& s : res.steps) EXPECT_GT(s.comm_bytes, 0) << "step " << s.step;
  return world->rank() == 0 ? nlohmann::json::parse(res.comm_report) : nlohmann::json();
}

const nlohmann::json* find_group(const nlohmann::json& rank, const std::string& group,
                                 const std::string& op) {
  for (const auto& g : rank["groups"])
    if (g["group"] == group && g["op"] == op) return &g;
  return nullptr;
}

}  // namespace

// --comm-report on a dense TP2 x FSDP4 layout whose sizes divide evenly (no padding): every
// FSDP group and every TP block moves exactly the least bytes its layout needs (the bounds
// are derived independently in train/comm_report.cpp and parallel/fsdp.cpp from the config;
// the bytes are counted at the Communicator), on every rank, and the counts are FSDP2's
// (2 all-gathers and 1 reduce-scatter per group and step, each one per parameter here; 4
// all-reduces per TP block).
// With micro_batches = 2 every forward gathers again but gradients are reduced once.
TEST(DistTrain, CommReportMeetsTheLayoutBounds) {
  for (int64_t micro : {1, 2}) {
    const auto report =
        comm_report_of("tp2_fsdp.yaml", {"train.steps=3", "model.moe.n_experts=0",
                                         "model.moe.layers=[]", "model.moe.shared_expert=false",
                                         "train.micro_batches=" + std::to_string(micro)});
    if (report.is_null()) continue;  // not rank 0
    ASSERT_EQ(report["ranks"].size(), 8u);
    for (const auto& rank : report["ranks"]) {
      int bounded = 0;
      for (const auto& g : rank["groups"]) {
        const std::string name = g["group"];
        if (name.rfind("fsdp", 0) != 0 && name.rfind("tp", 0) != 0) continue;
        ASSERT_TRUE(g.contains("ratio")) << name << " " << g["op"];
        EXPECT_NEAR(g["ratio"].get<double>(), 1.0, 1e-9) << name << " " << g["op"];
        ++bounded;
      }
      EXPECT_EQ(bounded, 3 * 2 + 2 + 2)
          << "fsdp: 3 groups x 2 ops, tp: 2 blocks, output 1 (its input gradient and the "
             "loss parallel sums all-reduced, no logits gathered), embeddings 1";
      const auto* ag = find_group(rank, "fsdp layers.0", "all_gather_into_tensor");
      const auto* rs = find_group(rank, "fsdp layers.0", "reduce_scatter_tensor");
      const auto* tp = find_group(rank, "tp layers.1", "all_reduce");
      ASSERT_TRUE(ag && rs && tp);
      // One collective per parameter of the block (2 norms, wq wk wv wo, w1 w2 w3), the
      // default where all of them split evenly on dim 0 (FSDPCollectives::kPerParam).
      const double params = 9;
      EXPECT_EQ((*ag)["calls"].get<double>(), 2.0 * micro * params);
      EXPECT_EQ((*rs)["calls"].get<double>(), 1.0 * params);
      EXPECT_EQ((*tp)["calls"].get<double>(), 4.0 * micro);
    }
  }
}

// The report shows what a layout wastes: the expert FSDP group of tp2_ep2_fsdp.yaml has 2
// local experts over 4 ranks; sharded on dim 0 (parallel.expert_shard_dim=0) half of its flat
// buffer is padding (bytes = 2 x the bound), on dim 1 (the automatic choice) none, so it
// moves exactly its bound. Expert-parallel exchange sends a token once to each other rank owning
// one of its experts, and one row back, plus a routing entry per pair: within 1% of its bound (one
// row per token and other rank each way, from the distinct-token counts the ranks exchange, plus
// the entries), the rest being the counts themselves.
TEST(DistTrain, CommReportShowsExpertPaddingAndExpertParallelAtItsBound) {
  // Padding shows on private all-gathers, which send whole padded segments; host-shared
  // gathers move only the rows a rank holds (below).
  const auto padded = comm_report_of(
      "tp2_ep2_fsdp.yaml",
      {"train.steps=2", "parallel.expert_shard_dim=0", "parallel.fsdp_host_shared=false"});
  const auto padded_shared =
      comm_report_of("tp2_ep2_fsdp.yaml", {"train.steps=2", "parallel.expert_shard_dim=0"});
  const auto report = comm_report_of("tp2_ep2_fsdp.yaml", {"train.steps=2"});
  // Without EP, on 8 ranks: the router [4, 64] and the experts [4, 64, 64] of the MoE block
  // go on dim 1 too (4 rows over 8 ranks would pad to 8), so every FSDP group is at its bound.
  const auto fsdp8 =
      comm_report_of("tp2_ep2_fsdp.yaml", {"train.steps=2", "parallel.tp=1", "parallel.ep=1"});
  if (report.is_null()) return;  // not rank 0
  for (const auto& rank : padded["ranks"])
    for (const char* op : {"all_gather_into_tensor", "reduce_scatter_tensor"}) {
      const auto* experts = find_group(rank, "fsdp layers.1.moe.experts", op);
      ASSERT_TRUE(experts);
      EXPECT_NEAR((*experts)["ratio"].get<double>(), 2.0, 1e-9) << op;
    }
  EXPECT_GE(padded["worst_ratio"].get<double>(), 2.0);
  // 2 local experts over 4 ranks on dim 0: 2 ranks hold one each (twice the 1/4 the bound
  // assumes), 2 hold none; over the ranks, exactly the bound.
  double ratio_sum = 0;
  int expert_ranks = 0;
  for (const auto& rank : padded_shared["ranks"]) {
    const auto* experts = find_group(rank, "fsdp layers.1.moe.experts", "all_gather_into_tensor");
    ASSERT_TRUE(experts);
    const double r = (*experts)["ratio"].get<double>();
    EXPECT_TRUE(std::abs(r) < 1e-9 || std::abs(r - 2.0) < 1e-9) << r;
    ratio_sum += r;
    ++expert_ranks;
  }
  EXPECT_NEAR(ratio_sum / expert_ranks, 1.0, 1e-9);
  for (const auto& rank : report["ranks"]) {
    for (const char* op : {"all_gather_into_tensor", "reduce_scatter_tensor"}) {
      const auto* experts = find_group(rank, "fsdp layers.1.moe.experts", op);
      ASSERT_TRUE(experts);
      EXPECT_NEAR((*experts)["ratio"].get<double>(), 1.0, 1e-9) << op;
    }
    const auto* ep = find_group(rank, "ep layers.1.moe", "all_to_all_single");
    ASSERT_TRUE(ep);
    EXPECT_GT((*ep)["ratio"].get<double>(), 1.0);  // the counts
    EXPECT_LE((*ep)["ratio"].get<double>(), 1.01);
    EXPECT_EQ((*ep)["calls"].get<double>(), 8.0)
        << "counts, pair rows, routing weights, dispatch, combine, and the backward of the "
           "last three";
  }
  EXPECT_LE(report["worst_ratio"].get<double>(), 1.01);
  int fsdp8_groups = 0;
  for (const auto& rank : fsdp8["ranks"])
    for (const auto& g : rank["groups"])
      if (g["group"].get<std::string>().rfind("fsdp", 0) == 0) {
        EXPECT_NEAR(g["ratio"].get<double>(), 1.0, 1e-9) << g["group"] << " " << g["op"];
        ++fsdp8_groups;
      }
  EXPECT_EQ(fsdp8_groups, 8 * 3 * 2) << "8 ranks x 3 groups (2 blocks, root) x 2 ops";
}

// reshard_after_forward: true keeps the root and the last block unsharded after forward
// (FSDP2's root, torchtitan's last block: one all-gather fewer each per step); "always"
// reshards them too. Only the communication differs: training is bit-identical.
TEST(DistTrain, ReshardAlwaysOnlyAddsGathers) {
  train::ParallelModel kept, always;
  const TrainRun a = run("tp2_fsdp.yaml", {"train.steps=3"}, true, &kept);
  const TrainRun b = run("tp2_fsdp.yaml",
                         {"train.steps=3", "parallel.reshard_after_forward=always"}, true, &always);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.grad_norms, b.grad_norms);
  ASSERT_EQ(kept.fsdp.size(), always.fsdp.size());
  for (size_t i = 0; i < kept.fsdp.size(); ++i) {
    EXPECT_EQ(always.fsdp[i].stats().all_gathers, 6) << always.fsdp[i].fqns().front();
    EXPECT_EQ(kept.fsdp[i].stats().all_gathers, i == 0 ? 6 : 3) << kept.fsdp[i].fqns().front();
  }
}
