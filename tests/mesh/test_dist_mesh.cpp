// DeviceMesh on 8 real processes: per-dim groups hold the right ranks, equal rank sets
// share one communicator, and everything built inside DeviceContext(meta) equals the same
// built outside, including the communicators' actual members (checked by all_gather).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/comm/world.h"
#include "hyperpar/core/device_context.h"
#include "hyperpar/mesh/device_mesh.h"

using namespace hyperpar;

namespace {
std::vector<int64_t> members(const std::shared_ptr<comm::Communicator>& g) {
  at::Tensor me = at::full({1}, comm::World::from_env()->rank(), at::kLong);
  at::Tensor all = at::empty({g->size()}, at::kLong);
  g->all_gather_into_tensor(all, me);
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + g->size());
}
}  // namespace

TEST(DistMesh, GroupsPerDimAndMetaRegression) {
  auto world = comm::World::from_env();
  ASSERT_EQ(world->size(), 8);
  const int64_t r = world->rank();
  for (auto shape : std::vector<std::vector<int64_t>>{{8}, {2, 4}, {4, 2}, {2, 2, 2}}) {
    std::vector<std::string> names;
    for (size_t i = 0; i < shape.size(); ++i) names.push_back("d" + std::to_string(i));
    auto outside = mesh::DeviceMesh::init(world, shape, names);
    std::optional<mesh::DeviceMesh> inside;
    std::vector<std::shared_ptr<comm::Communicator>> in_groups;
    {
      DeviceContext meta(c10::kMeta);
      inside = mesh::DeviceMesh::init(world, shape, names);
      for (int64_t d = 0; d < inside->ndim(); ++d) in_groups.push_back(inside->get_group(d));
      if (shape.size() >= 2) {
        auto cat = mesh::concatenate({(*inside)[names[0]], (*inside)[names.back()]});
        auto cat_out = mesh::concatenate({outside[names[0]], outside[names.back()]});
        EXPECT_EQ(cat, cat_out);
        EXPECT_EQ(cat.flatten("cat").get_group(0)->ranks(), cat_out.flatten("cat").ranks());
      }
    }
    EXPECT_EQ(*inside, outside);
    for (int64_t d = 0; d < outside.ndim(); ++d) {
      auto g = outside.get_group(d);
      EXPECT_EQ(g, in_groups[d]) << "equal rank sets must share one communicator";
      EXPECT_EQ(members(g), outside[names[d]].ranks());
      EXPECT_NE(std::find(g->ranks().begin(), g->ranks().end(), r), g->ranks().end());
    }
  }
  auto m = mesh::DeviceMesh::init(world, {2, 4}, {"dp", "tp"});
  if (r == 5) {
    EXPECT_EQ(m["dp"].ranks(), (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(m["tp"].ranks(), (std::vector<int64_t>{4, 5, 6, 7}));
  }
}

// PyTorch: root.get_group("dp_tp") works once "dp_tp" is flattened on the root.
TEST(DistMesh, GroupOfFlattenedNameOnRoot) {
  auto world = comm::World::from_env();
  auto root = mesh::DeviceMesh::init(world, {2, 4}, {"dp", "tp"});
  root.flatten("dp_tp");
  auto g = root.get_group("dp_tp");
  EXPECT_EQ(g->ranks(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(members(g), g->ranks());
  root["tp"].unflatten(0, {2, 2}, {"tp_out", "tp_in"});
  auto in = root.get_group("tp_in");
  const int64_t r = world->rank();
  EXPECT_EQ(in->ranks(), (std::vector<int64_t>{r - r % 2, r - r % 2 + 1}));
  EXPECT_EQ(members(in), in->ranks());
}
