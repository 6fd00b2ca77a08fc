// The registry: for every pair of distinct 1-D placements exactly one transition is
// suitable, and the expected one for the collective-backed pairs.
#include <gtest/gtest.h>

#include "hyperpar/dtensor/redistribute/transition.h"

using namespace hyperpar::dtensor;
using hyperpar::comm::ReduceOp;

TEST(TransitionRegistry, ExactlyOneSuitablePerPair) {
  const std::vector<Placement> all = {Shard{0},
                                      Shard{1},
                                      StridedShard{0, 2},
                                      StridedShard{1, 2},
                                      StridedShard{0, 4},
                                      Replicate{},
                                      Partial{},
                                      Partial{ReduceOp::kAvg},
                                      Partial{ReduceOp::kMax},
                                      Partial{ReduceOp::kMin}};
  int pairs = 0;
  for (const auto& a : all)
    for (const auto& b : all) {
      if (a == b) continue;
      int n = 0;
      for (const Transition* t : registered_transitions()) n += t->suitable(a, b);
      EXPECT_EQ(n, 1) << to_string(a) << " -> " << to_string(b);
      ++pairs;
    }
  EXPECT_EQ(pairs, 90);
  for (const Transition* t : registered_transitions())
    for (const auto& a : all) EXPECT_FALSE(t->suitable(a, a)) << t->name();
}

TEST(TransitionRegistry, CollectivePairsUseTheirTransition) {
  auto name = [](Placement a, Placement b) { return std::string(find_transition(a, b).name()); };
  EXPECT_EQ(name(Shard{0}, Replicate{}), "shard_to_replicate");
  EXPECT_EQ(name(StridedShard{0, 2}, Replicate{}), "strided_shard_to_replicate");
  EXPECT_EQ(name(Partial{}, Replicate{}), "partial_to_replicate");
  EXPECT_EQ(name(Partial{}, Shard{1}), "partial_to_shard");
  EXPECT_EQ(name(Shard{0}, Shard{1}), "shard_to_shard");
  EXPECT_EQ(name(Replicate{}, Shard{1}), "replicate_to_shard");
  EXPECT_EQ(name(Replicate{}, Partial{}), "replicate_to_partial");
  EXPECT_EQ(name(Shard{0}, Partial{}), "via_replicate");
  EXPECT_EQ(name(Partial{}, Partial{ReduceOp::kMax}), "via_replicate");
  EXPECT_EQ(name(Shard{0}, StridedShard{0, 2}), "via_replicate");
}
