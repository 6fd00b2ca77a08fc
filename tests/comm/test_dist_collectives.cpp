// Collectives on 8 real processes (run through hyperpar-run / mpirun): values on contiguous
// input, and a synchronous ContractError on non-contiguous, meta, wrong-dtype and
// wrong-size input. Every rank makes the same bad call, so every rank raises and none is
// left waiting; the barrier afterwards proves the group is still usable.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "hyperpar/comm/world.h"
#include "hyperpar/core/error.h"
#include "hyperpar/mesh/device_mesh.h"

using namespace hyperpar;
using comm::ReduceOp;

namespace {
std::shared_ptr<comm::World> world() { return comm::World::from_env(); }
mesh::DeviceMesh mesh24() { return mesh::DeviceMesh::init(world(), {2, 4}, {"dp", "tp"}); }
}  // namespace

TEST(DistCollectives, EightRanksOnTheExpectedBackend) {
  ASSERT_EQ(world()->size(), 8);
  // CTest names the backend each launch must have picked from its environment.
  const char* expect = std::getenv("HYPERPAR_EXPECT_BACKEND");
  ASSERT_NE(expect, nullptr) << "HYPERPAR_EXPECT_BACKEND is not set by the test registration";
  EXPECT_STREQ(comm::to_string(world()->backend()), expect);
  EXPECT_STREQ(mesh24().get_group("tp")->backend_name(), expect);
}

TEST(DistCollectives, AllReduceAllOps) {
  auto tp = mesh24().get_group("tp");
  const double r = world()->rank();
  double sum = 0, mx = -1, mn = 99;
  for (int64_t x : tp->ranks())
    sum += x, mx = std::max<double>(mx, x), mn = std::min<double>(mn, x);
  for (auto [op, want] : std::vector<std::pair<ReduceOp, double>>{{ReduceOp::kSum, sum},
                                                                  {ReduceOp::kAvg, sum / 4},
                                                                  {ReduceOp::kMax, mx},
                                                                  {ReduceOp::kMin, mn}}) {
    at::Tensor t = at::full({5}, r, at::kFloat);
    tp->all_reduce(t, op);
    EXPECT_TRUE(t.equal(at::full({5}, want, at::kFloat))) << comm::to_string(op) << t;
  }
  at::Tensor l = at::full({3}, static_cast<int64_t>(r), at::kLong);
  tp->all_reduce(l, ReduceOp::kSum);
  EXPECT_EQ(l[0].item<int64_t>(), static_cast<int64_t>(sum));
}

// all_reduce_into leaves its input unchanged on every path: the rings (tp, 4 ranks), the
// backend's own reduction (max; and 8 ranks with a tensor too large for the rings: MPI's
// out-of-place form, gloo's copy then in place), in place when out is in; and rejects an
// output of another shape or one that overlaps the input.
TEST(DistCollectives, AllReduceIntoKeepsItsInput) {
  auto tp = mesh24().get_group("tp");
  auto all = mesh::DeviceMesh::init(world(), {8}, {"all"}).get_group("all");
  const double r = world()->rank();
  for (auto [group, n, op] :
       std::vector<std::tuple<std::shared_ptr<comm::Communicator>, int64_t, ReduceOp>>{
           {tp, 5, ReduceOp::kSum},
           {tp, 5, ReduceOp::kAvg},
           {tp, 5, ReduceOp::kMax},
           {all, 100000, ReduceOp::kAvg}}) {
    const at::Tensor in = at::arange(n, at::kFloat) + r;
    const at::Tensor before = in.clone();
    at::Tensor out = at::full({n}, -1.0, at::kFloat);
    group->all_reduce_into(out, in, op);
    at::Tensor want = before.clone();
    group->all_reduce(want, op);
    EXPECT_TRUE(in.equal(before)) << comm::to_string(op) << " on " << group->label();
    EXPECT_TRUE(out.equal(want)) << comm::to_string(op) << " on " << group->label();
  }
  at::Tensor t = at::full({4}, r, at::kFloat);
  tp->all_reduce_into(t, t, ReduceOp::kSum);  // in place
  double sum = 0;
  for (int64_t x : tp->ranks()) sum += static_cast<double>(x);
  EXPECT_TRUE(t.equal(at::full({4}, sum, at::kFloat))) << t;
  at::Tensor buf = at::zeros({8});
  for (auto bad : {std::make_pair(at::zeros({5}), buf.narrow(0, 0, 4)),
                   std::make_pair(buf.narrow(0, 2, 4), buf.narrow(0, 0, 4))}) {
    std::string e;
    try {
      tp->all_reduce_into(bad.first, bad.second, ReduceOp::kSum);
    } catch (const ContractError& err) {
      e = err.what();
    }
    EXPECT_NE(e.find("all_reduce"), std::string::npos) << e;
    EXPECT_TRUE(e.find("shape") != std::string::npos || e.find("overlaps") != std::string::npos)
        << e;
  }
  tp->barrier();
}

TEST(DistCollectives, AllGatherReduceScatterAllToAllBroadcast) {
  auto m = mesh24();
  auto dp = m.get_group("dp");
  auto tp = m.get_group("tp");
  const int64_t r = world()->rank();
  at::Tensor in = at::arange(3, at::kFloat) + 10 * r;
  at::Tensor out = at::empty({4, 3});
  tp->all_gather_into_tensor(out, in);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_TRUE(out[i].equal(at::arange(3, at::kFloat) + 10 * tp->ranks()[i]));
  // bf16 moves as bytes.
  at::Tensor bout = at::empty({2, 3}, at::kBFloat16);
  dp->all_gather_into_tensor(bout, in.to(at::kBFloat16));
  EXPECT_TRUE(bout[dp->rank()].equal(in.to(at::kBFloat16)));
  // reduce_scatter: rank i of the group receives the sum of everyone's chunk i.
  at::Tensor rs_in = at::arange(8, at::kDouble) * (r + 1);
  at::Tensor rs_out = at::empty({2}, at::kDouble);
  tp->reduce_scatter_tensor(rs_out, rs_in, ReduceOp::kSum);
  double f = 0;
  for (int64_t x : tp->ranks()) f += x + 1;
  EXPECT_DOUBLE_EQ(rs_out[0].item<double>(), 2 * tp->rank() * f);
  EXPECT_DOUBLE_EQ(rs_out[1].item<double>(), (2 * tp->rank() + 1) * f);
  tp->reduce_scatter_tensor(rs_out, rs_in, ReduceOp::kAvg);
  EXPECT_DOUBLE_EQ(rs_out[1].item<double>(), (2 * tp->rank() + 1) * f / 4);
  // all_to_all_single with uneven splits: group rank g sends g+1 rows to every peer.
  const int64_t g = tp->rank();
  at::Tensor a_in = at::full({4 * (g + 1), 2}, static_cast<double>(r), at::kFloat);
  std::vector<int64_t> in_splits(4, g + 1), out_splits = {1, 2, 3, 4};
  at::Tensor a_out = at::empty({10, 2});
  auto work = tp->all_to_all_single(a_out, a_in, out_splits, in_splits, {"", true});
  work->wait();
  int64_t row = 0;
  for (int64_t p = 0; p < 4; ++p)
    for (int64_t k = 0; k <= p; ++k, ++row) EXPECT_EQ(a_out[row][0].item<float>(), tp->ranks()[p]);
  at::Tensor b = at::full({4}, static_cast<double>(r), at::kFloat);
  tp->broadcast(b, 2);
  EXPECT_EQ(b[0].item<float>(), tp->ranks()[2]);
  tp->barrier();
}

TEST(DistCollectives, AsyncWorkCompletes) {
  auto tp = mesh24().get_group("tp");
  std::vector<at::Tensor> ts;
  std::vector<comm::WorkHandle> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(at::full({1024}, 1.0, at::kFloat));
    works.push_back(tp->all_reduce(ts.back(), ReduceOp::kSum, {"async", true}));
  }
  for (auto& w : works) w->wait();
  for (auto& t : ts) EXPECT_EQ(t[7].item<float>(), 4.0f);
  EXPECT_TRUE(works[0]->is_completed());
}

// Several all-gathers in flight on one group at once (FSDP issues one per parameter), one
// of them empty, waited on in reverse order, with a user's tagged message between them: each
// lands in its own output (gloo carries them as tagged point-to-point messages).
TEST(DistCollectives, AllGathersInFlightTogetherLandInTheirOwnOutputs) {
  auto tp = mesh24().get_group("tp");
  const int64_t g = tp->rank(), n = tp->size();
  std::vector<at::Tensor> outs;
  std::vector<comm::WorkHandle> works;
  for (int64_t len : {5, 0, 3000}) {
    at::Tensor in = at::arange(len, at::kFloat) + 1000 * g + len;
    outs.push_back(at::full({n * len}, -1.0, at::kFloat));
    works.push_back(tp->all_gather_into_tensor(outs.back(), in, {"inflight", true}));
  }
  // A user's message with tag 0 between peers 0 <-> 1 of the group, while the gathers fly.
  at::Tensor msg = at::full({4}, static_cast<double>(g), at::kFloat);
  if (g < 2) {
    comm::CollectiveOptions o{"user message", true, 0};
    auto s = tp->send(msg, 1 - g, o);
    at::Tensor got = at::empty({4});
    tp->recv(got, 1 - g, o)->wait();
    s->wait();
    EXPECT_EQ(got[0].item<float>(), 1 - g);
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  const std::vector<int64_t> lens{5, 0, 3000};
  for (size_t k = 0; k < lens.size(); ++k)
    for (int64_t p = 0; p < n; ++p)
      EXPECT_TRUE(outs[k]
                      .narrow(0, p * lens[k], lens[k])
                      .equal(at::arange(lens[k], at::kFloat) + 1000 * p + lens[k]))
          << "gather " << k << " from group rank " << p;
}

// A sum all-reduce of different random floats gives every rank of the group bitwise the same
// result (TP ranks must hold identical replicas), on both the 4-rank tp groups and the
// 8-rank world, large enough that gloo sums some in shared memory and some with its ring.
TEST(DistCollectives, SumAllReduceIsBitwiseTheSameOnEveryRank) {
  auto m = mesh24();
  for (auto group : {m.get_group("tp"), world()->group({0, 1, 2, 3, 4, 5, 6, 7}, "world")}) {
    for (int64_t numel : {int64_t{1000}, int64_t{300000}}) {
      at::manual_seed(1234 + world()->rank());
      at::Tensor t = at::randn({numel});
      group->all_reduce(t, ReduceOp::kSum);
      at::Tensor all = at::empty({group->size(), numel});
      group->all_gather_into_tensor(all, t);
      for (int64_t r = 1; r < group->size(); ++r)
        EXPECT_TRUE(all[r].equal(all[0])) << "group " << group->label() << ", " << numel
                                          << " elements: rank " << r << " differs from rank 0";
    }
  }
}

TEST(DistCollectives, SynchronousContractErrorsThenGroupStillWorks) {
  auto tp = mesh24().get_group("tp");
  at::Tensor base = at::randn({4, 4});
  auto expect_contract = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ContractError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_NE(m.find("mesh dim tp ranks"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("(") + tp->backend_name() + ")"), std::string::npos) << m;
      EXPECT_NE(m.find("grad.w"), std::string::npos) << m;
    }
  };
  comm::CollectiveOptions o{"grad.w", false};
  expect_contract([&] { tp->all_reduce(base.t(), ReduceOp::kSum, o); }, "not contiguous");
  expect_contract(
      [&] {
        tp->all_gather_into_tensor(at::empty({16, 2}), base.narrow(1, 0, 2), o);
      },
      "not contiguous");
  expect_contract(
      [&] {
        tp->reduce_scatter_tensor(at::empty({4}), at::empty({16}, at::kMeta), ReduceOp::kSum, o);
      },
      "meta");
  expect_contract(
      [&] {
        tp->reduce_scatter_tensor(at::empty({4}, at::kHalf), at::randn({16}), ReduceOp::kSum, o);
      },
      "expected Float");
  expect_contract([&] { tp->all_gather_into_tensor(at::empty({15}), at::randn({4}), o); },
                  "expected group size 4");
  expect_contract([&] { tp->all_to_all_single(at::empty({8}), at::randn({6}), {}, {}, o); },
                  "not divisible by group size 4");
  at::Tensor t = at::ones({2});
  tp->all_reduce(t, ReduceOp::kSum);
  EXPECT_EQ(t[0].item<float>(), 4.0f);
}

// Point to point in a ring of the tp group (4 ranks): two messages in flight per pair, sent
// with tags 1 then 2 and received 2 then 1, so only the tags can pair them.
TEST(DistCollectives, SendRecvPairsByTag) {
  auto tp = mesh24().get_group("tp");
  const int64_t me = tp->rank(), n = tp->size();
  const int64_t next = (me + 1) % n, prev = (me + n - 1) % n;
  at::Tensor a = at::full({3, 5}, static_cast<double>(100 * world()->rank() + 1));
  at::Tensor b = at::full({7}, static_cast<double>(100 * world()->rank() + 2));
  comm::CollectiveOptions o1{"pp.act", true, 1}, o2{"pp.grad", true, 2};
  auto s1 = tp->send(a, next, o1);
  auto s2 = tp->send(b, next, o2);
  at::Tensor rb = at::empty({7}), ra = at::empty({3, 5});
  auto r2 = tp->recv(rb, prev, o2);
  auto r1 = tp->recv(ra, prev, o1);
  r2->wait();
  r1->wait();
  s1->wait();
  s2->wait();
  const int64_t from = tp->ranks()[prev];
  EXPECT_TRUE(at::all(ra == 100 * from + 1).item<bool>());
  EXPECT_TRUE(at::all(rb == 100 * from + 2).item<bool>());
}

TEST(DistCollectives, SendRecvContractErrorsAreSynchronous) {
  auto tp = mesh24().get_group("tp");
  auto expect_contract = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ContractError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_NE(m.find("pp.act"), std::string::npos) << m;
    }
  };
  comm::CollectiveOptions o{"pp.act", false, 3};
  const int64_t other = (tp->rank() + 1) % tp->size();
  expect_contract([&] { tp->send(at::randn({4, 4}).t(), other, o); }, "not contiguous");
  expect_contract([&] { tp->recv(at::empty({4}, at::kMeta), other, o); }, "meta");
  expect_contract([&] { tp->send(at::randn({4}), tp->rank(), o); }, "is this rank itself");
  expect_contract([&] { tp->recv(at::empty({4}), 4, o); }, "not a group rank");
  comm::CollectiveOptions big{"pp.act", false, 1 << 24};
  expect_contract([&] { tp->send(at::randn({4}), other, big); }, "message_tag");
  tp->barrier();
}

// A message of another size than the receiver's buffer is an error naming the recv: group
// rank 1 expects 4 floats, rank 0 sends 5.
TEST(DistCollectives, SendRecvSizeMismatchNamesTheRecv) {
  auto tp = mesh24().get_group("tp");
  if (tp->rank() == 0) tp->send(at::randn({5}), 1, {"pp.act", false, 9});
  if (tp->rank() == 1) {
    try {
      tp->recv(at::empty({4}), 0, {"pp.act", false, 9});
      ADD_FAILURE() << "a 5-float message filled a 4-float buffer";
    } catch (const std::exception& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("recv on mesh dim tp ranks"), std::string::npos) << m;
      EXPECT_NE(m.find("the message has 20 bytes, the buffer 16"), std::string::npos) << m;
    }
  }
  tp->barrier();
}
