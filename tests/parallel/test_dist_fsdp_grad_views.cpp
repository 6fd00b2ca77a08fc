// Regression (b) of the reported failure, on 8 ranks: gradients that reach FSDP's reduction
// as non-contiguous views go through reduce-scatter (and the HSDP all-reduce) and come out
// right. The module uses
//   * a TP Shard(1) weight gathered with redistribute (S(1) -> R), its gradient the local
//     chunk of the gathered gradient (the to_local() of a redistribute);
//   * stacked expert weights used transposed (experts.transpose(1, 2) in an elementwise
//     product): autograd hands the gradient over as a transposed, non-contiguous view.
// Expected gradients are computed in-process from every data-parallel rank's inputs; fp32
// sums of <= 8 terms: tolerance 1e-6 relative. Also: two synced backwards accumulate.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"
#include "hyperpar/parallel/fsdp.h"

using namespace hyperpar;
using namespace hyperpar::dtensor;

namespace {

at::Tensor seeded(std::vector<int64_t> shape, int64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape);
}

class ViewUser : public nn::Module {
 public:
  explicit ViewUser(const mesh::DeviceMesh& tp)
      : Module("ViewUser"), tp_spec(tp, {Shard{1}}, {8, 6}) {
    register_parameter("tp_weight", {8, 6}, InitScheme::normal(0, 1));
    register_parameter("experts", {2, 6, 8}, InitScheme::normal(0, 1));
    nn::distribute_parameter(param("tp_weight"), tp, {Shard{1}});
    nn::distribute_parameter(param("experts"), tp, {Replicate{}});
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor w = redistribute_local(value("tp_weight"), tp_spec, {Replicate{}}, std::nullopt,
                                      "tp_weight gather");
    at::Tensor mixed = (value("experts").transpose(1, 2) * mix).sum(0);  // [8, 6]
    return at::cat({at::matmul(x, w), at::matmul(x, mixed)}, 1);         // [n, 12]
  }
  DTensorSpec tp_spec;
  at::Tensor mix = seeded({2, 8, 6}, 7);  // the same constant on every rank
};

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

void check(const std::vector<int64_t>& mesh_shape, const std::vector<std::string>& names) {
  auto world = comm::World::from_env();
  ASSERT_EQ(world->size(), 8);
  auto mesh = mesh::DeviceMesh::init(world, mesh_shape, names);
  const bool hsdp = mesh_shape.size() == 3;
  auto dp = hsdp ? mesh.slice({names[0], names[1]}) : mesh[names[0]];
  ViewUser m(mesh["tp"]);
  m.init_weights(3);
  auto h = parallel::fully_shard(m, dp);
  const auto coord = *mesh.get_coordinate();
  const int64_t n_dp = hsdp ? 4 : 4, my_dp = hsdp ? coord[0] * 2 + coord[1] : coord[0];
  at::Tensor out = m(seeded({3, 8}, 100 + my_dp));
  (out * seeded({3, 12}, 200 + my_dp)).sum().backward();
  // Expected: the mean over data-parallel ranks of x_d^T c_d, split into the two uses.
  at::Tensor g = at::zeros({8, 12});
  for (int64_t d = 0; d < n_dp; ++d)
    g += at::matmul(seeded({3, 8}, 100 + d).t(), seeded({3, 12}, 200 + d));
  g /= static_cast<double>(n_dp);
  at::Tensor want_tp = g.narrow(1, 0, 6);
  at::Tensor want_experts = (g.narrow(1, 6, 6).unsqueeze(0) * m.mix).transpose(1, 2);
  auto& tw = m.param("tp_weight");
  auto& ew = m.param("experts");
  EXPECT_GE(h.stats().noncontiguous_grads, 1) << "the experts' gradient should arrive as a view";
  EXPECT_EQ(h.stats().reduce_scatters, 1);
  EXPECT_EQ(h.stats().all_reduces, hsdp ? 1 : 0);
  const at::Tensor got_tp = DTensor(tw.data.grad(), *tw.spec).full_tensor();
  const at::Tensor got_ex = DTensor(ew.data.grad(), *ew.spec).full_tensor();
  EXPECT_LE(rel_diff(got_tp, want_tp), 1e-6) << to_string(tw.spec->placements());
  EXPECT_LE(rel_diff(got_ex, want_experts), 1e-6) << to_string(ew.spec->placements());
}

}  // namespace

TEST(FsdpGradViews, NonContiguousGradientsReduceScatter) { check({4, 2}, {"dp", "tp"}); }

TEST(FsdpGradViews, NonContiguousGradientsHsdpAllReduce) { check({2, 2, 2}, {"rep", "dp", "tp"}); }

// Two synced backwards without zero_grad between them: the first reduction's gradients are
// views of its receive buffer, so the second must reduce elsewhere and add to them (reusing
// the buffer would overwrite them: 2 x the second pass's gradients instead of the sum).
TEST(FsdpGradViews, GradientsOfTwoSyncedBackwardsAccumulate) {
  auto world = comm::World::from_env();
  ASSERT_EQ(world->size(), 8);
  auto mesh = mesh::DeviceMesh::init(world, {4, 2}, {"dp", "tp"});
  ViewUser m(mesh["tp"]);
  m.init_weights(3);
  auto h = parallel::fully_shard(m, mesh["dp"]);
  const int64_t n_dp = 4, my_dp = (*mesh.get_coordinate())[0];
  at::Tensor g = at::zeros({8, 12});
  for (int64_t pass = 0; pass < 2; ++pass) {
    at::Tensor out = m(seeded({3, 8}, 100 + 10 * pass + my_dp));
    (out * seeded({3, 12}, 200 + 10 * pass + my_dp)).sum().backward();
    for (int64_t d = 0; d < n_dp; ++d)
      g +=
          at::matmul(seeded({3, 8}, 100 + 10 * pass + d).t(), seeded({3, 12}, 200 + 10 * pass + d));
  }
  g /= static_cast<double>(n_dp);
  EXPECT_EQ(h.stats().reduce_scatters, 2);
  EXPECT_EQ(h.stats().grads_viewing_buffer, 2) << "the first pass's two gradients";
  auto& tw = m.param("tp_weight");
  auto& ew = m.param("experts");
  const at::Tensor want_experts = (g.narrow(1, 6, 6).unsqueeze(0) * m.mix).transpose(1, 2);
  EXPECT_LE(rel_diff(DTensor(tw.data.grad(), *tw.spec).full_tensor(), g.narrow(1, 0, 6)), 1e-6);
  EXPECT_LE(rel_diff(DTensor(ew.data.grad(), *ew.spec).full_tensor(), want_experts), 1e-6);
}
