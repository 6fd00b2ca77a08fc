// The N-D planner on simulated worlds: the steps it chooses, and its cache keyed by value.
#include <gtest/gtest.h>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/redistribute/planner.h"

using namespace hyperpar;
using namespace hyperpar::dtensor;

namespace {
mesh::DeviceMesh mesh24(int64_t rank = 5) {
  return mesh::DeviceMesh::init(comm::World::simulated(rank, 8), {2, 4}, {"dp", "tp"});
}
std::string describe(const RedistributePlan& p) {
  std::string s;
  for (const auto& st : p.steps)
    s += std::to_string(st.mesh_dim) + ":" + st.transition->name() + " ";
  return s;
}
}  // namespace

TEST(Planner, DirectStepsWhenSafe) {
  DTensorSpec s(mesh24(), {Shard{0}, Shard{1}}, {8, 8});
  EXPECT_EQ(describe(*plan_redistribute(s, {Shard{0}, Replicate{}})), "1:shard_to_replicate ");
  EXPECT_EQ(describe(*plan_redistribute(s, {Replicate{}, Replicate{}})),
            "1:shard_to_replicate 0:shard_to_replicate ");
  DTensorSpec p(mesh24(), {Partial{}, Shard{1}}, {8, 8});
  EXPECT_EQ(describe(*plan_redistribute(p, {Shard{0}, Shard{1}})), "0:partial_to_shard ");
  // Swapping dims: after tp's all-to-all, dp's would touch a dim tp now shards, so the rest
  // goes through Replicate (correct, not minimal; a rare layout change).
  EXPECT_EQ(describe(*plan_redistribute(s, {Shard{1}, Shard{0}})),
            "1:shard_to_shard 1:shard_to_replicate 0:shard_to_replicate 0:replicate_to_shard "
            "1:replicate_to_shard ");
  EXPECT_EQ(describe(*plan_redistribute(s, {Shard{0}, Shard{0}})), "1:shard_to_shard ");
}

TEST(Planner, NestedShardsGoThroughReplicate) {
  DTensorSpec s(mesh24(), {Shard{0}, Shard{0}}, {8, 8});
  // Gathering dp first would be wrong (tp splits each dp block): tp, dp, then chunk tp.
  EXPECT_EQ(describe(*plan_redistribute(s, {Replicate{}, Shard{0}})),
            "1:shard_to_replicate 0:shard_to_replicate 1:replicate_to_shard ");
  DTensorSpec ss(mesh24(), {StridedShard{0, 4}, Shard{0}}, {8, 8});
  EXPECT_EQ(describe(*plan_redistribute(ss, {Replicate{}, Shard{0}})),
            "1:shard_to_replicate 0:strided_shard_to_replicate 1:replicate_to_shard ");
}

TEST(Planner, CachedByValue) {
  const size_t before = redistribute_plans_computed();
  DTensorSpec a(mesh24(), {Replicate{}, Shard{1}}, {4, 12});
  auto p1 = plan_redistribute(a, {Replicate{}, Replicate{}});
  DTensorSpec b(mesh24(), {Replicate{}, Shard{1}}, {4, 12});  // equal value, new object
  auto p2 = plan_redistribute(b, {Replicate{}, Replicate{}});
  EXPECT_EQ(p1.get(), p2.get());
  EXPECT_EQ(redistribute_plans_computed(), before + 1);
  DTensorSpec c(mesh24(), {Replicate{}, Shard{1}}, {4, 13});
  EXPECT_NE(plan_redistribute(c, {Replicate{}, Replicate{}}).get(), p1.get());
  EXPECT_THROW(plan_redistribute(a, {Replicate{}}), Error);
  EXPECT_THROW(plan_redistribute(a, {Replicate{}, Shard{2}}), Error);
}
