// Pipeline parallelism end to end on 8 real ranks against the single-rank run of the same
// 8-layer MoE model (configs/pp2_tp2_ep2_fsdp.yaml with pp = tp = ep = 1 on a 1-rank world,
// meta init): every step's loss and global grad norm, the val_loss every 5 steps and this
// rank's final weights within 1e-5 relative (fp32; the schedules only reorder microbatches
// whose gradients are summed, so differences come from summation order, measured ~1e-7).
// Layouts: PP2 x FSDP2 x TP2 (1F1B), PP2 x TP2 x EP2 with FSDP (GPipe), PP4 interleaved with
// 2 virtual stages per rank (x FSDP2), PP8 zero bubble (I/W split), PP2 x HSDP(2) x TP2, and
// gradient accumulation (train.micro_batches) around the schedule.
// Communication: one all-gather and one reduce-scatter per FSDP group and step whatever the
// number of microbatches.
#include <gtest/gtest.h>

#include "common/train_run.h"

using namespace hyperpar;
using namespace hyperpar::test;

namespace {

constexpr int kSteps = 10;

std::vector<std::string> with(std::vector<std::string> sets) {
  sets.push_back("train.steps=" + std::to_string(kSteps));
  return sets;
}

const TrainRun& pp_baseline() {
  static TrainRun r =
      run("pp2_tp2_ep2_fsdp.yaml",
          with({"parallel.pp=1", "parallel.tp=1", "parallel.ep=1", "parallel.pp_microbatches=1"}),
          false);
  return r;
}

}  // namespace

TEST(DistPipeline, Pp2Fsdp2Tp2OneFOneB) {
  expect_matches(run("pp2_tp2_ep2_fsdp.yaml", with({"parallel.ep=1"}), true), pp_baseline(), 1e-5,
                 "pp2 fsdp2 tp2 1F1B");
}

TEST(DistPipeline, Pp2Tp2Ep2FsdpGPipe) {
  expect_matches(run("pp2_tp2_ep2_fsdp.yaml", with({"parallel.pp_schedule=GPipe"}), true),
                 pp_baseline(), 1e-5, "pp2 tp2 ep2 fsdp GPipe");
}

TEST(DistPipeline, Pp4Interleaved1F1BTwoVirtualStages) {
  expect_matches(run("pp2_tp2_ep2_fsdp.yaml",
                     with({"parallel.pp=4", "parallel.tp=1", "parallel.ep=1",
                           "parallel.pp_schedule=Interleaved1F1B", "parallel.pp_virtual_stages=2"}),
                     true),
                 pp_baseline(), 1e-5, "pp4 v2 interleaved 1F1B fsdp2");
}

TEST(DistPipeline, Pp8ZeroBubble) {
  expect_matches(
      run("pp2_tp2_ep2_fsdp.yaml",
          with({"parallel.pp=8", "parallel.tp=1", "parallel.ep=1",
                "parallel.pp_schedule=InterleavedZeroBubble", "parallel.pp_microbatches=8"}),
          true),
      pp_baseline(), 1e-5, "pp8 zero bubble");
}

// Zero bubble with tp: the last stage's backward-input runs through the (loss parallel) loss
// with the graph retained and its backward-weight through it again.
TEST(DistPipeline, Pp4Tp2ZeroBubbleLossParallel) {
  expect_matches(
      run("pp2_tp2_ep2_fsdp.yaml",
          with({"parallel.pp=4", "parallel.tp=2", "parallel.ep=1",
                "parallel.pp_schedule=InterleavedZeroBubble", "parallel.pp_microbatches=4"}),
          true),
      pp_baseline(), 1e-5, "pp4 tp2 zero bubble");
}

TEST(DistPipeline, Pp2Hsdp2Tp2) {
  expect_matches(run("pp2_tp2_ep2_fsdp.yaml",
                     with({"parallel.ep=1", "parallel.dp_replicate=2", "parallel.dp_shard=1",
                           "parallel.pp_microbatches=2"}),
                     true),
                 pp_baseline(), 1e-5, "pp2 hsdp2 tp2");
}

// Gradient accumulation around the pipeline: 2 micro-batches, each running the whole
// schedule (FSDP reduces once, after the second), equal one big batch.
TEST(DistPipeline, GradientAccumulationAroundTheSchedule) {
  expect_matches(
      run("pp2_tp2_ep2_fsdp.yaml",
          with({"parallel.ep=1", "train.micro_batches=2", "parallel.pp_microbatches=2"}), true),
      pp_baseline(), 1e-5, "pp2 fsdp2 tp2, micro_batches 2");
}

// FSDP under PP as torchtitan configures it: per step and group one all-gather (UNSHARD)
// and one reduce-scatter (after the last microbatch's backward), not one per microbatch.
TEST(DistPipeline, CommunicationOncePerStepAndStage) {
  train::ParallelModel pm;
  const int steps = 2;
  run("pp2_tp2_ep2_fsdp.yaml", {"parallel.ep=1", "train.steps=2"}, true, &pm);
  ASSERT_FALSE(pm.fsdp.empty());
  for (auto& h : pm.fsdp) {
    if (h.fqns().empty()) continue;
    // + one all-gather per evaluation (every 5 steps; none within 2 steps)
    EXPECT_EQ(h.stats().all_gathers, steps) << h.fqns().front();
    EXPECT_EQ(h.stats().reduce_scatters, steps) << h.fqns().front();
    EXPECT_EQ(h.stats().prefetched, 0) << h.fqns().front();
    const auto& st = h.stats();  // reused by step 2; a host window replaces the gather's 2
    EXPECT_EQ(st.buffer_allocations, st.per_param_collectives ? 1
                                     : st.host_shared_params  ? 2
                                                              : 4)
        << h.fqns().front();
  }
  // Rank 0's stage 0 holds layers 0-3 and the embedding; stage 1 layers 4-7 and the head.
  for (auto& [name, p] : pm.model->named_parameters()) {
    (void)p;
    const bool first_half = name.rfind("tok_embeddings", 0) == 0 ||
                            name.rfind("layers.0.", 0) == 0 || name.rfind("layers.1.", 0) == 0 ||
                            name.rfind("layers.2.", 0) == 0 || name.rfind("layers.3.", 0) == 0;
    EXPECT_EQ(first_half, pm.pp_rank == 0) << name;
  }
}

namespace {

void expect_identical(const TrainRun& got, const TrainRun& want, const std::string& what) {
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.grad_norms, want.grad_norms) << what;
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  for (const auto& [n, w] : got.weights)
    EXPECT_TRUE(at::equal(w, want.weights.at(n))) << what << ": final weight " << n;
}

}  // namespace

// Activation checkpointing on 8 ranks changes no bit: TP2 x EP2 x FSDP (full recomputes the
// blocks' FSDP gathers, TP collectives and EP all-to-alls; selective none of them), and
// under pipeline schedules, including the zero-bubble I/W split (I computes input gradients
// only, W the parameters' through a second recomputation).
TEST(DistPipeline, ActivationCheckpointIsBitIdentical) {
  const std::vector<std::string> base{"train.steps=3"};
  const TrainRun plain = run("tp2_ep2_fsdp.yaml", base, true);
  for (const char* mode : {"full", "selective"}) {
    auto sets = base;
    sets.push_back(std::string("parallel.activation_checkpoint=") + mode);
    expect_identical(run("tp2_ep2_fsdp.yaml", sets, true), plain, std::string("tp2 ep2 ") + mode);
  }
  const std::vector<std::string> pp2{"train.steps=3"};
  const TrainRun pp2_plain = run("pp2_tp2_ep2_fsdp.yaml", pp2, true);
  for (const char* mode : {"every:2", "selective"}) {
    auto sets = pp2;
    sets.push_back(std::string("parallel.activation_checkpoint=") + mode);
    expect_identical(run("pp2_tp2_ep2_fsdp.yaml", sets, true), pp2_plain,
                     std::string("pp2 tp2 ep2 ") + mode);
  }
  const std::vector<std::string> zb{"train.steps=3",
                                    "parallel.pp=8",
                                    "parallel.tp=1",
                                    "parallel.ep=1",
                                    "parallel.pp_schedule=InterleavedZeroBubble",
                                    "parallel.pp_microbatches=8"};
  auto zb_full = zb;
  zb_full.push_back("parallel.activation_checkpoint=full");
  expect_identical(run("pp2_tp2_ep2_fsdp.yaml", zb_full, true),
                   run("pp2_tp2_ep2_fsdp.yaml", zb, true), "pp8 zero bubble full");
}
