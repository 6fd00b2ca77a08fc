// Redistribute matrix on 8 real ranks: meshes (8), (2,4), (4,2), (2,2,2); tensors with
// even, uneven and empty shards. For every sampled source -> target pair:
//   * the result's local block is exactly the target's slice of the full tensor (or, with a
//     Partial target, reduces back to it) and is contiguous;
//   * full_tensor() of the result equals the full tensor;
//   * the gradient through redistribute equals the analytic one: with L = sum(full(y) * W),
//     dL/dx is W laid out as the source (Partial -> Replicate), both with the default
//     gradient layout and with a Partial gradient hint on the target's Replicate dims.
// Values are small integers in float32, so every comparison is exact.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>

#include "hyperpar/comm/world.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"

using namespace hyperpar;
using namespace hyperpar::dtensor;

namespace {

std::shared_ptr<comm::World> world() { return comm::World::from_env(); }

// This rank's term of a Partial(sum) layout of `full`: coordinate 0 on every Partial mesh dim
// holds full - (terms held elsewhere); the others hold a small integer pattern.
at::Tensor local_of(const at::Tensor& full, const DTensorSpec& spec) {
  at::Tensor block = take_ranges(full, spec.local_ranges());
  const auto coord = spec.coordinate();
  const auto ms = spec.mesh().shape();
  for (size_t m = 0; m < ms.size(); ++m) {
    if (!is_partial(spec.placements()[m])) continue;
    // Split block into ms[m] terms: term c = (c + 1) for c > 0, term 0 = block - sum(others).
    double others = 0;
    for (int64_t c = 1; c < ms[m]; ++c) others += c + 1;
    block = coord[m] == 0 ? block - others : at::full_like(block, coord[m] + 1.0);
  }
  return block.contiguous();
}

// W laid out as `placements` (a gradient layout: no Partial unless `partial_on_coord0`).
at::Tensor grad_local_of(const at::Tensor& w, const DTensorSpec& spec) {
  at::Tensor block = take_ranges(w, spec.local_ranges());
  const auto coord = spec.coordinate();
  for (size_t m = 0; m < coord.size(); ++m)
    if (is_partial(spec.placements()[m]) && coord[m] != 0) block = at::zeros_like(block);
  return block.contiguous();
}

std::vector<Placements> all_tuples(int64_t ndim, const std::vector<Placement>& choices) {
  std::vector<Placements> out = {{}};
  for (int64_t d = 0; d < ndim; ++d) {
    std::vector<Placements> next;
    for (const auto& t : out)
      for (const auto& c : choices) {
        auto u = t;
        u.push_back(c);
        next.push_back(u);
      }
    out = next;
  }
  return out;
}

struct Counts {
  int pairs = 0;
};

void check_pair(const mesh::DeviceMesh& mesh, const std::vector<int64_t>& shape,
                const Placements& src, const Placements& dst, Counts& counts) {
  const std::string what = mesh.to_string() + " shape " + c10::str(c10::IntArrayRef(shape)) + " " +
                           to_string(src) + " -> " + to_string(dst);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  at::Tensor full = at::arange(numel, at::kFloat).reshape(shape);
  at::Tensor w = (at::arange(numel, at::kFloat).reshape(shape) * 3 + 1).remainder(17);
  DTensorSpec sspec(mesh, src, shape);
  DTensorSpec dspec(mesh, dst, shape);
  at::Tensor x = local_of(full, sspec).requires_grad_(true);
  DTensor xd(x, sspec);
  DTensor y = xd.redistribute(dst);
  ASSERT_TRUE(y.to_local().is_contiguous()) << what;
  if (!dspec.has_partial()) {
    ASSERT_TRUE(y.to_local().equal(take_ranges(full, dspec.local_ranges()))) << what;
  }
  at::Tensor yf = y.full_tensor();
  ASSERT_TRUE(yf.equal(full)) << what;
  // Gradient with the default layout: W as normalized(dst) in, W as normalized(src) out.
  DTensorSpec gspec(mesh, normalized_for_grad(dst), shape);
  (y.to_local() * grad_local_of(w, gspec)).sum().backward();
  DTensorSpec want_spec(mesh, normalized_for_grad(src), shape);
  ASSERT_TRUE(x.grad().defined()) << what;
  ASSERT_TRUE(x.grad().equal(take_ranges(w, want_spec.local_ranges()))) << what;
  // With a Partial gradient on the target's Replicate dims.
  Placements hint = normalized_for_grad(dst);
  bool any = false;
  for (auto& p : hint)
    if (is_replicate(p)) p = Partial{}, any = true;
  if (any) {
    at::Tensor x2 = local_of(full, sspec).requires_grad_(true);
    at::Tensor y2 = redistribute_local(x2, sspec, dst, hint);
    (y2 * grad_local_of(w, DTensorSpec(mesh, hint, shape))).sum().backward();
    ASSERT_TRUE(x2.grad().equal(take_ranges(w, want_spec.local_ranges()))) << what << " (P hint)";
  }
  ++counts.pairs;
}

void run_matrix(const mesh::DeviceMesh& mesh, const std::vector<std::vector<int64_t>>& shapes,
                size_t max_pairs_per_shape) {
  const std::vector<Placement> choices = {Shard{0}, Shard{1}, Replicate{}, Partial{},
                                          StridedShard{0, 2}};
  const auto tuples = all_tuples(mesh.ndim(), choices);
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t a = 0; a < tuples.size(); ++a)
    for (size_t b = 0; b < tuples.size(); ++b) pairs.push_back({a, b});
  // Same sample on every rank (fixed seed).
  std::mt19937 rng(1234);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  Counts counts;
  for (const auto& shape : shapes)
    for (size_t i = 0; i < pairs.size() && i < max_pairs_per_shape; ++i)
      check_pair(mesh, shape, tuples[pairs[i].first], tuples[pairs[i].second], counts);
  if (world()->rank() == 0)
    std::cout << mesh.to_string() << ": " << counts.pairs << " pairs checked\n";
}

}  // namespace

TEST(DistRedistribute, OneDimMeshAllPairs) {
  auto mesh = mesh::DeviceMesh::init(world(), {8}, {"x"});
  // even (16,8), uneven (7,5) and (5,9), empty shards (2,3), empty tensor (0,4)
  run_matrix(mesh, {{16, 8}, {7, 5}, {5, 9}, {2, 3}, {0, 4}}, 1000);
}

TEST(DistRedistribute, TwoDimMeshes) {
  for (auto shape : std::vector<std::vector<int64_t>>{{2, 4}, {4, 2}}) {
    auto mesh = mesh::DeviceMesh::init(world(), shape, {"a", "b"});
    run_matrix(mesh, {{7, 5}}, 1000);                    // all 625 pairs, uneven
    run_matrix(mesh, {{8, 16}, {3, 2}, {3, 4, 5}}, 80);  // even, empty shards, 3-D
  }
}

TEST(DistRedistribute, ThreeDimMesh) {
  auto mesh = mesh::DeviceMesh::init(world(), {2, 2, 2}, {"a", "b", "c"});
  run_matrix(mesh, {{7, 5}}, 400);
  run_matrix(mesh, {{8, 8}, {1, 3}}, 100);
}

TEST(DistRedistribute, PartialAvgMaxMin) {
  auto mesh = mesh::DeviceMesh::init(world(), {2, 4}, {"a", "b"});
  const double c = mesh.get_local_rank(1);
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  DTensor avg(base + (c - 1.5),
              DTensorSpec(mesh, {Replicate{}, Partial{comm::ReduceOp::kAvg}}, {3, 4}));
  EXPECT_TRUE(avg.full_tensor().equal(base));
  DTensor mx(base + c, DTensorSpec(mesh, {Replicate{}, Partial{comm::ReduceOp::kMax}}, {3, 4}));
  EXPECT_TRUE(mx.redistribute({Replicate{}, Shard{0}}).full_tensor().equal(base + 3));
  DTensor mn(base + c, DTensorSpec(mesh, {Replicate{}, Partial{comm::ReduceOp::kMin}}, {3, 4}));
  EXPECT_TRUE(mn.full_tensor().equal(base));
  // Partial(sum) -> Partial(max) goes through Replicate: the value is kept.
  DTensor s =
      DTensor::from_local(c == 0 ? base : at::zeros_like(base), mesh, {Replicate{}, Partial{}});
  EXPECT_TRUE(
      s.redistribute({Replicate{}, Partial{comm::ReduceOp::kMax}}).full_tensor().equal(base));
}

TEST(DistRedistribute, DistributeAndErrors) {
  auto mesh = mesh::DeviceMesh::init(world(), {2, 4}, {"a", "b"});
  // Only rank 0's values count: the others pass garbage of the same shape.
  at::Tensor full =
      world()->rank() == 0 ? at::arange(40, at::kFloat).reshape({10, 4}) : at::full({10, 4}, -1.0f);
  DTensor d = DTensor::distribute(full, mesh, {Shard{1}, Shard{0}});
  EXPECT_TRUE(d.full_tensor().equal(at::arange(40, at::kFloat).reshape({10, 4})));
  EXPECT_EQ(d.to_local().size(0), mesh.get_local_rank(1) < 3 ? 3 : 1);
  EXPECT_THROW(DTensor(at::zeros({5, 5}), DTensorSpec(mesh, {Shard{0}, Replicate{}}, {10, 4})),
               Error);
  EXPECT_THROW(d.redistribute({Replicate{}}), Error);
  // A meta DTensor redistributes to a meta result without communication.
  DTensorSpec mspec(mesh, {Shard{1}, Shard{0}}, {10, 4});
  DTensor m(at::empty(mspec.local_shape(), at::kMeta), mspec);
  at::Tensor mf = m.full_tensor();
  EXPECT_TRUE(mf.is_meta());
  EXPECT_EQ(mf.sizes(), (c10::IntArrayRef{10, 4}));
}
