// Pipeline schedules in one process: every generator over a grid of (pp, virtual stages,
// microbatches) is valid after lowering (with and without FSDP actions), broken schedules are
// caught, bubbles are what the formulas say, and the notation round-trips.
#include <gtest/gtest.h>

#include "hyperpar/core/error.h"
#include "hyperpar/parallel/pipeline/simulator.h"

using namespace hyperpar;
using namespace hyperpar::parallel::pipeline;

namespace {
constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kInterleaved1F1B,
                                   ScheduleKind::kInterleavedZeroBubble};
}

TEST(PipelineAction, NotationRoundTrips) {
  for (const char* s : {"0F1", "12B0", "2I3", "2W3", "0SEND_F1", "1RECV_F1", "1SEND_B0", "0RECV_B0",
                        "0UNSHARD", "3RESHARD", "0REDUCE_GRAD"})
    EXPECT_EQ(to_string(parse_action(s)), s);
  EXPECT_EQ(parse_action("3SEND_B12"), (Action{3, ActionType::kSendB, 12}));
  for (const char* s : {"F1", "0X1", "0F", "0UNSHARD2", "0F1x"})
    EXPECT_THROW(parse_action(s), UsageError) << s;
}

TEST(PipelineSchedule, EveryScheduleOfTheGridIsValid) {
  int checked = 0;
  for (auto kind : kKinds)
    for (int64_t pp : {1, 2, 3, 4, 8})
      for (int64_t v : {1, 2, 3, 4})
        for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16}) {
          ScheduleSpec s{kind, pp, v, m};
          try {
            check_schedule(s);
          } catch (const UsageError&) {
            continue;  // impossible sizes: tested below
          }
          for (bool fsdp : {false, true}) {
            const auto r = simulate(lowered_schedule(s, fsdp), s);
            EXPECT_TRUE(r.ok()) << schedule_name(kind) << " pp " << pp << " v " << v << " m " << m
                                << (fsdp ? " fsdp" : "") << ": " << r.problems.front();
            ++checked;
          }
        }
  EXPECT_GT(checked, 300);
}

TEST(PipelineSchedule, BubblesFollowTheFormulas) {
  // GPipe and 1F1B: (pp - 1) / (m + pp - 1) with these costs.
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    ScheduleSpec s{kind, 4, 1, 8};
    EXPECT_NEAR(simulate(lowered_schedule(s, false), s).bubble_fraction, 3.0 / 11.0, 1e-12);
  }
  // Interleaving and zero bubble shrink it.
  ScheduleSpec one{ScheduleKind::k1F1B, 4, 1, 8}, inter{ScheduleKind::kInterleaved1F1B, 4, 2, 8},
      zb{ScheduleKind::kInterleavedZeroBubble, 4, 1, 8};
  const double b1 = simulate(lowered_schedule(one, false), one).bubble_fraction;
  EXPECT_LT(simulate(lowered_schedule(inter, false), inter).bubble_fraction, b1);
  EXPECT_LT(simulate(lowered_schedule(zb, false), zb).bubble_fraction, b1);
}

TEST(PipelineSchedule, BrokenSchedulesAreCaught) {
  ScheduleSpec s{ScheduleKind::k1F1B, 4, 1, 8};
  const RankActions good = lowered_schedule(s, true);
  auto problem = [&](const RankActions& a) {
    std::string all;
    for (const auto& p : simulate(a, s).problems) all += p + "\n";
    return all;
  };
  // A receive nobody sends.
  RankActions a = good;
  a[1].erase(std::find(a[1].begin(), a[1].end(), Action{1, ActionType::kRecvF, 3}));
  EXPECT_NE(problem(a).find("0SEND_F3 x1 but 1RECV_F3 x0"), std::string::npos) << problem(a);
  // Rank 1 waiting for a backward before the forward that feeds it: deadlock.
  a = good;
  auto& r1 = a[1];
  const auto f = std::find(r1.begin(), r1.end(), Action{1, ActionType::kRecvF, 0});
  const auto b = std::find(r1.begin(), r1.end(), Action{1, ActionType::kRecvB, 0});
  std::rotate(f, b, b + 1);  // 1RECV_B0 first
  EXPECT_NE(problem(a).find("deadlock"), std::string::npos) << problem(a);
  EXPECT_NE(problem(a).find("waits forever at 1RECV_B0"), std::string::npos) << problem(a);
  // A microbatch computed twice, one on the wrong rank.
  a = good;
  a[0].push_back({0, ActionType::kForward, 2});
  EXPECT_NE(problem(a).find("0F2 runs 2 times, expected 1"), std::string::npos);
  a = good;
  a[0].push_back({1, ActionType::kForward, 9});
  EXPECT_NE(problem(a).find("is not one of its stages"), std::string::npos);
  // FSDP: computing after the stage was resharded.
  a = good;
  std::swap(a[2][a[2].size() - 2], a[2][a[2].size() - 4]);  // RESHARD before the last B
  EXPECT_NE(problem(a).find("stage 2"), std::string::npos) << problem(a);
}

TEST(PipelineSchedule, ImpossibleCombinationsNameTheValues) {
  auto err = [](ScheduleSpec s, int64_t layers) {
    try {
      check_schedule(s, layers);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({ScheduleKind::kGPipe, 4, 2, 8}, -1).find("pp_virtual_stages 2"),
            std::string::npos);
  EXPECT_NE(err({ScheduleKind::kInterleaved1F1B, 4, 2, 9}, -1)
                .find("pp_microbatches 9 must be a multiple of its rounds"),
            std::string::npos);
  EXPECT_NE(
      err({ScheduleKind::kInterleaved1F1B, 4, 2, 8}, 6).find("model.n_layers 6 is fewer than"),
      std::string::npos);
  EXPECT_NE(err({ScheduleKind::k1F1B, 0, 1, 8}, -1).find("must be >= 1"), std::string::npos);
  EXPECT_EQ(err({ScheduleKind::kInterleaved1F1B, 4, 2, 8}, 8), "");
  EXPECT_THROW(parse_schedule("Looped", "parallel.pp_schedule"), UsageError);
}
