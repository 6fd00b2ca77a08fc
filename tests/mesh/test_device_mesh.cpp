// DeviceMesh on simulated worlds, in one process: every operation, its errors, and the
// meta-context regression (DESIGN.md invariant 1).
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <unordered_set>

#include "hyperpar/comm/world.h"
#include "hyperpar/core/device_context.h"
#include "hyperpar/core/error.h"
#include "hyperpar/mesh/device_mesh.h"

using hyperpar::DeviceContext;
using hyperpar::Error;
using hyperpar::comm::World;
using hyperpar::mesh::concatenate;
using hyperpar::mesh::DeviceMesh;
using V = std::vector<int64_t>;

namespace {
DeviceMesh mesh_of(int64_t rank, V shape, std::vector<std::string> names) {
  int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  return DeviceMesh::init(World::simulated(rank, n), shape, names);
}
}  // namespace

TEST(DeviceMesh, WorkedExampleRank5) {
  auto m = mesh_of(5, {2, 4}, {"dp", "tp"});
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.shape(), (V{2, 4}));
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(*m.get_coordinate(), (V{1, 1}));
  EXPECT_EQ(m["dp"].ranks(), (V{1, 5}));
  EXPECT_EQ(m["tp"].ranks(), (V{4, 5, 6, 7}));
  EXPECT_EQ(m.get_local_rank("dp"), 1);
  EXPECT_EQ(m.get_local_rank("tp"), 1);
  EXPECT_EQ(m.group_ranks(1), (V{4, 5, 6, 7}));
  EXPECT_EQ(m.all_group_ranks(0), (std::vector<V>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.all_group_ranks(1), (std::vector<V>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.slice({"dp", "tp"}), m);
}

TEST(DeviceMesh, EveryRankOfThreeByTwoAndTwoThreeTwo) {
  for (int64_t r = 0; r < 6; ++r) {
    auto m = mesh_of(r, {3, 2}, {"a", "b"});
    EXPECT_EQ(*m.get_coordinate(), (V{r / 2, r % 2}));
    EXPECT_EQ(m["a"].ranks(), (V{r % 2, 2 + r % 2, 4 + r % 2}));
    EXPECT_EQ(m["b"].ranks(), (V{r / 2 * 2, r / 2 * 2 + 1}));
  }
  for (int64_t r = 0; r < 12; ++r) {
    auto m = mesh_of(r, {2, 3, 2}, {"x", "y", "z"});
    V c = {r / 6, (r / 2) % 3, r % 2};
    EXPECT_EQ(*m.get_coordinate(), c);
    EXPECT_EQ(m["y"].ranks(), (V{c[0] * 6 + c[2], c[0] * 6 + 2 + c[2], c[0] * 6 + 4 + c[2]}));
    auto xz = m.slice({"x", "z"});
    EXPECT_EQ(xz.shape(), (V{2, 2}));
    EXPECT_EQ(xz.ranks(), (V{c[1] * 2, c[1] * 2 + 1, 6 + c[1] * 2, 6 + c[1] * 2 + 1}));
    EXPECT_EQ(concatenate({m["x"], m["y"], m["z"]}), m);
    EXPECT_EQ(concatenate({m["x"], m["z"]}), xz);
  }
}

TEST(DeviceMesh, FourDimsAndExplicitRanks) {
  auto m = mesh_of(13, {2, 2, 2, 2}, {"a", "b", "c", "d"});
  EXPECT_EQ(*m.get_coordinate(), (V{1, 1, 0, 1}));
  EXPECT_EQ(m.slice({"b", "d"}).ranks(), (V{8, 9, 12, 13}));
  // Explicit rank array: ranks need not be in order.
  auto e = DeviceMesh::from_ranks(World::simulated(2, 4), {2, 2}, {3, 2, 1, 0}, {"p", "q"});
  EXPECT_EQ(*e.get_coordinate(), (V{0, 1}));
  EXPECT_EQ(e["p"].ranks(), (V{2, 0}));
  EXPECT_EQ(e["q"].ranks(), (V{3, 2}));
  // A subset mesh: rank 3 not in it.
  auto sub = DeviceMesh::from_ranks(World::simulated(3, 4), {2}, {0, 1}, {"x"});
  EXPECT_FALSE(sub.get_coordinate().has_value());
  EXPECT_THROW(sub["x"], Error);
}

TEST(DeviceMesh, ValidationErrors) {
  auto w = World::simulated(0, 8);
  EXPECT_THROW(DeviceMesh::init(w, {2, 2}, {"a", "b"}), Error);        // 4 != 8
  EXPECT_THROW(DeviceMesh::init(w, {2, 4}, {"a", "a"}), Error);        // duplicate
  EXPECT_THROW(DeviceMesh::init(w, {2, 4}, {"a", ""}), Error);         // empty name
  EXPECT_THROW(DeviceMesh::init(w, {2, 4}, {"a"}), Error);             // names count
  EXPECT_THROW(DeviceMesh::init(w, {0, 8}, {"a", "b"}), Error);        // zero size
  EXPECT_THROW(DeviceMesh::init(w, {-2, -4}, {"a", "b"}), Error);      // negative
  EXPECT_THROW(DeviceMesh::from_ranks(w, {2}, {0, 9}, {"a"}), Error);  // out of range
  EXPECT_THROW(DeviceMesh::from_ranks(w, {2}, {1, 1}, {"a"}), Error);  // repeated
  EXPECT_THROW(DeviceMesh::from_ranks(w, {3}, {0, 1}, {"a"}), Error);  // count
  auto m = DeviceMesh::init(w, {2, 4}, {"dp", "tp"});
  EXPECT_THROW(m["nope"], Error);
  try {
    m.slice({"tp", "dp"});
    FAIL() << "out-of-order slice accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("order"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.size(2), Error);
}

TEST(DeviceMesh, FlattenRegistersOnRoot) {
  auto m = mesh_of(6, {2, 2, 2}, {"dp", "ep", "tp"});
  auto f = m.slice({"ep", "tp"}).flatten();
  EXPECT_EQ(f.dim_names(), (std::vector<std::string>{"ep_tp"}));
  EXPECT_EQ(f.ranks(), (V{4, 5, 6, 7}));
  EXPECT_EQ(m["ep_tp"], f);
  EXPECT_EQ(m.slice({"dp", "ep_tp"}).ranks(), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.slice({"ep", "tp"}).flatten(), f);                // same name, same layout: same mesh
  EXPECT_THROW(m.slice({"dp", "tp"}).flatten("ep_tp"), Error);  // same name, other layout
  auto dt = m.slice({"dp", "tp"}).flatten("dp_tp");             // non-adjacent dims
  EXPECT_EQ(dt.ranks(), (V{2, 3, 6, 7}));                       // ep fixed at rank 6's coordinate 1
  EXPECT_EQ(m.flatten().size(), 8);
  EXPECT_EQ(m.flatten().get_local_rank(0), 6);
}

TEST(DeviceMesh, Unflatten) {
  auto m = mesh_of(5, {8}, {"world"});
  auto u = m.unflatten(0, {2, 4}, {"dp", "tp"});
  EXPECT_EQ(u, mesh_of(5, {2, 4}, {"dp", "tp"}));
  EXPECT_EQ(m["tp"].ranks(), (V{4, 5, 6, 7}));  // registered on the root
  EXPECT_EQ(u["tp"].unflatten(0, {2, 2}, {"a", "b"})["b"].ranks(), (V{4, 5}));
  EXPECT_THROW(m.unflatten(0, {3, 3}, {"a", "b"}), Error);
  EXPECT_NO_THROW(m.unflatten(0, {2, 4}, {"dp", "x"}));      // dp: same layout as registered
  EXPECT_THROW(m.unflatten(0, {4, 2}, {"dp", "y"}), Error);  // dp: another layout
}

TEST(DeviceMesh, ConcatenateErrors) {
  auto w = World::simulated(3, 8);
  auto m = DeviceMesh::init(w, {2, 2, 2}, {"a", "b", "c"});
  EXPECT_EQ(concatenate({m["a"], m["c"]}).ranks(), (V{2, 3, 6, 7}));  // b fixed at 1
  EXPECT_THROW(concatenate({m["c"], m["a"]}), Error);                 // order
  EXPECT_THROW(concatenate({m.slice({"a", "b"}), m["b"]}), Error);    // overlap
  auto other = DeviceMesh::init(w, {2, 2, 2}, {"a", "b", "c"});
  EXPECT_THROW(concatenate({m["a"], other["b"]}), Error);  // different roots
}

TEST(DeviceMesh, EqualityHashAndTensorView) {
  auto a = mesh_of(1, {2, 4}, {"dp", "tp"});
  auto b = mesh_of(1, {2, 4}, {"dp", "tp"});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a, mesh_of(1, {2, 4}, {"dp", "sp"}));
  std::unordered_set<DeviceMesh> set{a, b, a["tp"]};
  EXPECT_EQ(set.size(), 2u);
  DeviceContext meta(c10::kMeta);
  auto t = a.mesh_tensor();
  EXPECT_EQ(t.device(), c10::Device(c10::kCPU));
  EXPECT_EQ(t.sizes(), (c10::IntArrayRef{2, 4}));
  EXPECT_EQ(t[1][2].item<int64_t>(), 6);
  EXPECT_NE(a.to_string().find("dp=2"), std::string::npos);
}

TEST(DeviceMesh, GroupsOnSimulatedWorld) {
  auto m = mesh_of(5, {2, 4, 1}, {"dp", "tp", "one"});
  auto g = m.get_group("one");  // a size-1 dim: a local communicator
  EXPECT_EQ(g->ranks(), (V{5}));
  EXPECT_EQ(m.get_group(2), g);            // same ranks, same communicator
  EXPECT_THROW(m.get_group("tp"), Error);  // no peers in a simulated world
}

TEST(DeviceMesh, HundredThousandRanks) {
  auto w = World::simulated(77777, 100000);
  auto m = DeviceMesh::init(w, {10, 10, 1000}, {"pp", "dp", "tp"});
  EXPECT_EQ(*m.get_coordinate(), (V{7, 7, 777}));
  EXPECT_EQ(m["dp"].ranks().size(), 10u);
  EXPECT_EQ(m["dp"].ranks()[3], 73777);
  auto f = m.slice({"pp", "dp"}).flatten();
  EXPECT_EQ(f.get_local_rank(0), 77);
  EXPECT_EQ(concatenate({m["pp_dp"], m["tp"]}).size(), 100000);
  EXPECT_EQ(m["tp"].unflatten(0, {10, 100}, {"ep", "etp"})["etp"].size(), 100);
}

// The reported crash: meshes built while the ambient device is meta. Every operation must
// give exactly what it gives outside the context.
TEST(DeviceMesh, MetaContextRegression) {
  for (auto shape : std::vector<V>{{8}, {2, 4}, {3, 2}, {2, 3, 2}, {2, 2, 2, 2}}) {
    int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    std::vector<std::string> names;
    for (size_t i = 0; i < shape.size(); ++i) names.push_back("d" + std::to_string(i));
    for (int64_t r = 0; r < n; ++r) {
      auto run = [&] {
        auto m = mesh_of(r, shape, names);
        std::vector<V> out = {m.ranks(), *m.get_coordinate()};
        for (int64_t d = 0; d < m.ndim(); ++d) {
          out.push_back(m[names[d]].ranks());
          out.push_back({m.get_local_rank(d)});
          out.push_back(m.group_ranks(d));
        }
        auto f = m.flatten();
        out.push_back(f.ranks());
        out.push_back(m.unflatten(0, {shape[0]}, {"u0"}).ranks());
        if (shape.size() >= 2) {
          out.push_back(concatenate({m[names[0]], m[names.back()]}).ranks());
          out.push_back(m.slice({names[0], names.back()}).flatten("first_last").ranks());
        }
        out.push_back(m.mesh_tensor().device().is_cpu() ? V{1} : V{0});
        return out;
      };
      auto outside = run();
      std::vector<V> inside;
      {
        DeviceContext meta(c10::kMeta);
        inside = run();
      }
      EXPECT_EQ(inside, outside) << "rank " << r;
    }
  }
}

// PyTorch's unflatten is row-major over the flattened dim, so any factorisation works:
// (4, 3) flattened, then (3, 4), (2, 6), (6, 2), (12,); and non-power-of-two 30 = 2x3x5.
TEST(DeviceMesh, UnflattenFlattenedIntoAnotherFactorisation) {
  for (int64_t r = 0; r < 12; ++r) {
    auto m = mesh_of(r, {4, 3}, {"a", "b"});
    auto flat = m.flatten("ab");
    for (V sizes : {V{3, 4}, V{2, 6}, V{6, 2}, V{12}, V{2, 2, 3}}) {
      std::vector<std::string> names;
      for (size_t i = 0; i < sizes.size(); ++i)
        names.push_back("f" + std::to_string(sizes.size()) + "_" + std::to_string(i) + "_" +
                        std::to_string(sizes[0]));
      auto u = flat.unflatten(0, sizes, names);
      ASSERT_EQ(u.shape(), sizes);
      EXPECT_EQ(u.ranks(), flat.ranks());
      // Row-major: the coordinate of flat index r in `sizes`.
      V coord(sizes.size());
      int64_t rest = r;
      for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
        coord[d] = rest % sizes[d];
        rest /= sizes[d];
      }
      EXPECT_EQ(*u.get_coordinate(), coord) << "rank " << r;
      // The innermost dim's group: consecutive ranks.
      const int64_t inner = sizes.back();
      V expect;
      for (int64_t i = 0; i < inner; ++i) expect.push_back(r - r % inner + i);
      EXPECT_EQ(u.group_ranks(u.ndim() - 1), expect) << "rank " << r;
      // Its names resolve on the root too.
      EXPECT_EQ(m.slice({names.back()}).ranks(), expect);
    }
  }
  // Part of a mesh: (2, 3, 5), dims b and c flattened to 15, then unflattened as (5, 3).
  for (int64_t r = 0; r < 30; ++r) {
    auto m = mesh_of(r, {2, 3, 5}, {"a", "b", "c"});
    auto u = m.slice({"b", "c"}).flatten("bc").unflatten(0, {5, 3}, {"x", "y"});
    const int64_t base = r - r % 15, in = r % 15;
    EXPECT_EQ(u["y"].ranks(),
              (V{base + in - in % 3, base + in - in % 3 + 1, base + in - in % 3 + 2}));
    V x;
    for (int64_t i = 0; i < 5; ++i) x.push_back(base + in % 3 + 3 * i);
    EXPECT_EQ(m["x"].ranks(), x) << "rank " << r;
    // x and a are disjoint dims of the root: they slice together, in root order.
    EXPECT_EQ(m.slice({"a", "x"}).shape(), (V{2, 5}));
    EXPECT_THROW(m.slice({"x", "b"}), Error) << "x overlaps b";
  }
}

TEST(DeviceMesh, LocalRankOfFlattenedNameOnRoot) {
  auto m = mesh_of(5, {2, 4}, {"dp", "tp"});
  m.flatten("dp_tp");
  EXPECT_EQ(m.get_local_rank("dp_tp"), 5);
  m["tp"].unflatten(0, {2, 2}, {"tp_out", "tp_in"});
  EXPECT_EQ(m.get_local_rank("tp_in"), 1);
  EXPECT_EQ(m.get_local_rank("tp_out"), 0);
  EXPECT_EQ(m.get_local_rank("tp"), 1);
  EXPECT_THROW(m.get_local_rank("nope"), Error);
}
