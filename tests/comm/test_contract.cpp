// Contract checks (DESIGN.md invariant 2) on the single-rank communicator, in one process:
// the same checks run before every backend's collective.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/comm/world.h"
#include "hyperpar/core/error.h"

using namespace hyperpar;
using comm::ReduceOp;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Contract, RejectsNonContiguousMetaWrongDtypeWrongSize) {
  auto world = comm::World::simulated(0, 1);
  auto g = world->group({0}, "mesh dim tp ranks [0]");
  comm::CollectiveOptions tag{"layers.0.wq.weight", false};
  at::Tensor base = at::randn({4, 6});
  std::string e = error_of([&] { g->all_reduce(base.t(), ReduceOp::kSum, tag); });
  EXPECT_NE(e.find("all_reduce"), std::string::npos) << e;
  EXPECT_NE(e.find("not contiguous"), std::string::npos) << e;
  EXPECT_NE(e.find("layers.0.wq.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("mesh dim tp ranks [0]"), std::string::npos) << e;
  EXPECT_NE(e.find("strides [1, 6]"), std::string::npos) << e;
  for (auto bad : {base.narrow(1, 1, 3), base.select(1, 0), at::randn({1, 6}).expand({4, 6})}) {
    EXPECT_NE(error_of([&] { g->all_reduce(bad, ReduceOp::kSum); }), "") << bad.strides();
  }
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  e = error_of([&] { g->all_gather_into_tensor(at::empty({4}), meta); });
  EXPECT_NE(e.find("meta"), std::string::npos) << e;
  e = error_of([&] {
    g->reduce_scatter_tensor(at::empty({4}, at::kDouble), at::randn({4}), ReduceOp::kSum);
  });
  EXPECT_NE(e.find("dtype Double, expected Float"), std::string::npos) << e;
  e = error_of([&] { g->all_gather_into_tensor(at::empty({5}), at::randn({4})); });
  EXPECT_NE(e.find("expected group size 1"), std::string::npos) << e;
  e = error_of([&] { g->all_reduce(at::ones({3}, at::kLong), ReduceOp::kAvg); });
  EXPECT_NE(e.find("avg needs a floating dtype"), std::string::npos) << e;
  e = error_of([&] { g->all_to_all_single(at::empty({4, 2}), at::randn({4, 3}), {}, {}); });
  EXPECT_NE(e.find("differ beyond dim 0"), std::string::npos) << e;
  e = error_of([&] { g->all_to_all_single(at::empty({4}), at::randn({4}), {4}, {3}); });
  EXPECT_NE(e.find("split sizes"), std::string::npos) << e;
  e = error_of([&] { g->broadcast(at::randn({4}), 1); });
  EXPECT_NE(e.find("root 1"), std::string::npos) << e;
}

TEST(Contract, SingleRankCollectivesAreCopies) {
  auto world = comm::World::simulated(3, 4);
  auto g = world->group({3}, "solo");
  EXPECT_EQ(g->rank(), 0);
  at::Tensor in = at::arange(6, at::kFloat);
  at::Tensor out = at::empty({6});
  g->all_gather_into_tensor(out, in);
  EXPECT_TRUE(out.equal(in));
  at::Tensor rs = at::empty({6});
  g->reduce_scatter_tensor(rs, in, ReduceOp::kAvg);
  EXPECT_TRUE(rs.equal(in));
  EXPECT_EQ(world->group({3}, "again"), g);
  EXPECT_NE(g->label().find("again"), std::string::npos);
  EXPECT_THROW(world->group({3, 2}, "pair"), Error);
}
