// checkpoint/ in one process: box math, the manifest check, an atomic single-rank save and
// load (bit-identical), keep, a crashed save, corrupted files and name/shape mismatches
// (errors naming file or FQN, nothing loaded), and a foreign (manifest-less, PyTorch
// layout) directory of boxes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "hyperpar/checkpoint/boxes.h"
#include "hyperpar/checkpoint/checkpoint.h"
#include "hyperpar/checkpoint/manifest.h"
#include "hyperpar/comm/world.h"
#include "hyperpar/core/error.h"
#include "hyperpar/mesh/device_mesh.h"
#include "hyperpar/nn/safetensors.h"

using namespace hyperpar;
using checkpoint::Box;
using dtensor::IndexRanges;
namespace fs = std::filesystem;
using V = std::vector<int64_t>;

namespace {

using hyperpar::testing::TempDir;

checkpoint::TensorShard whole(const std::string& fqn, at::Tensor t) {
  std::vector<IndexRanges> r;
  for (int64_t d = 0; d < t.dim(); ++d) r.push_back({{0, t.size(d)}});
  return {fqn, t, t.sizes().vec(), r, true};
}

std::vector<checkpoint::TensorShard> sample(bool zeros) {
  auto make = [&](V shape, double base) {
    at::Tensor t = at::arange(base, base + at::ones(shape).numel(), at::kFloat).reshape(shape);
    return zeros ? at::zeros_like(t) : t;
  };
  return {whole("layers.0.w", make({4, 6}, 0)), whole("emb", make({10, 3}, 100)),
          whole("optimizer.exp_avg.layers.0.w", make({4, 6}, 1000))};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CheckpointBoxes, StridedShardRowsAreTwoBoxes) {
  const auto boxes = checkpoint::boxes_of({{{2, 2}, {6, 2}}, {{0, 6}}});
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_EQ(boxes[0].offsets, (V{2, 0}));
  EXPECT_EQ(boxes[0].sizes, (V{2, 6}));
  EXPECT_EQ(boxes[0].local_offsets, (V{0, 0}));
  EXPECT_EQ(boxes[1].offsets, (V{6, 0}));
  EXPECT_EQ(boxes[1].local_offsets, (V{2, 0}));
  // Two split dims: the product; an empty range (short torch.chunk part) drops its boxes.
  EXPECT_EQ(checkpoint::boxes_of({{{0, 1}, {4, 1}}, {{0, 2}, {5, 2}}}).size(), 4u);
  EXPECT_EQ(checkpoint::boxes_of({{{0, 1}, {3, 0}}, {{0, 2}}}).size(), 1u);
  EXPECT_TRUE(checkpoint::boxes_of({{{9, 0}}}).empty());
}

TEST(CheckpointBoxes, IntersectAndReplicaOwner) {
  Box a{{0, 0}, {4, 6}, {}}, b{{2, 4}, {4, 4}, {}};
  auto i = checkpoint::intersect(a, b);
  ASSERT_TRUE(i);
  EXPECT_EQ(i->offsets, (V{2, 4}));
  EXPECT_EQ(i->sizes, (V{2, 2}));
  EXPECT_FALSE(checkpoint::intersect(a, Box{{4, 0}, {1, 6}, {}}));
  // (2,4) mesh ("dp","tp"), (Replicate, Shard(0)): only dp coordinate 0 writes.
  for (int64_t r = 0; r < 8; ++r) {
    auto mesh = mesh::DeviceMesh::init(comm::World::simulated(r, 8), {2, 4}, {"dp", "tp"});
    dtensor::DTensorSpec spec(mesh, {dtensor::Replicate{}, dtensor::Shard{0}}, {8, 4});
    EXPECT_EQ(checkpoint::writes_replica(spec, r), r < 4) << "rank " << r;
  }
  EXPECT_TRUE(checkpoint::writes_replica(std::nullopt, 0));
  EXPECT_FALSE(checkpoint::writes_replica(std::nullopt, 3));
}

TEST(Checkpoint, SingleRankRoundTripKeepAndCrashedSave) {
  TempDir d;
  auto world = comm::World::simulated(0, 1);
  const auto src = sample(false);
  checkpoint::SaveOptions keep2;
  keep2.keep = 2;
  for (int64_t step : {1, 2, 3})
    checkpoint::save(d.path, step, src, "{\"step\": " + std::to_string(step) + "}", *world, keep2);
  EXPECT_FALSE(fs::exists(d.path + "/step-1")) << "keep 2 deletes the oldest";
  EXPECT_TRUE(fs::exists(d.path + "/step-2"));
  // A save killed midway leaves only its .tmp directory: ignored, the previous one stays.
  fs::create_directories(d.path + "/step-4.tmp-99");
  std::ofstream(d.path + "/step-4.tmp-99/rank-00000-part-0.safetensors") << "half";
  EXPECT_EQ(checkpoint::latest_complete(d.path), d.path + "/step-3");
  auto dst = sample(true);
  const auto r = checkpoint::load(checkpoint::latest_complete(d.path), dst, *world);
  EXPECT_EQ(r.state_json.substr(0, 11), "{\"step\": 3}");
  for (size_t i = 0; i < src.size(); ++i)
    EXPECT_TRUE(at::equal(src[i].local, dst[i].local)) << src[i].fqn;
  // The PyTorch DCP layout: sharding info in each file's metadata, an index of FQNs.
  const nn::SafetensorsFile f(d.path + "/step-3/rank-00000-part-0.safetensors");
  EXPECT_EQ(f.metadata().at("DCP_SHARDING_INFO").find("\"emb\": {\"saved_offsets\": [0, 0]}") !=
                std::string::npos,
            true);
  EXPECT_TRUE(fs::exists(d.path + "/step-3/model.safetensors.index.json"));
  EXPECT_TRUE(checkpoint::verify(d.path + "/step-3",
                                 checkpoint::read_manifest(d.path + "/step-3/manifest.json"))
                  .empty());
}

TEST(Checkpoint, CorruptionAndMismatchAreReportedAndNothingIsLoaded) {
  TempDir d;
  auto world = comm::World::simulated(0, 1);
  const std::string ck = checkpoint::save(d.path, 5, sample(false), "{\"step\": 5}", *world);
  const std::string part = ck + "/rank-00000-part-0.safetensors";
  const auto bytes = fs::file_size(part);
  // Altered: one byte flipped.
  {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(bytes - 3));
    f.put('\x7f');
  }
  auto dst = sample(true);
  std::string e = error_of([&] { checkpoint::load(ck, dst, *world); });
  EXPECT_NE(e.find(part + " has xxh64"), std::string::npos) << e;
  EXPECT_NE(e.find("(altered)"), std::string::npos) << e;
  EXPECT_NE(e.find("nothing was loaded"), std::string::npos) << e;
  EXPECT_EQ(at::count_nonzero(dst[0].local).item<int64_t>(), 0) << "nothing written";
  EXPECT_THROW(checkpoint::load(ck, dst, *world), UsageError);
  // Truncated.
  fs::resize_file(part, bytes - 100);
  e = error_of([&] { checkpoint::load(ck, dst, *world); });
  EXPECT_NE(e.find("has " + std::to_string(bytes - 100) + " bytes, the manifest says " +
                   std::to_string(bytes)),
            std::string::npos)
      << e;
  // Missing.
  fs::remove(part);
  e = error_of([&] { checkpoint::load(ck, dst, *world); });
  EXPECT_NE(e.find(part + " is missing"), std::string::npos) << e;

  // Names and shapes.
  const std::string ok = checkpoint::save(d.path, 6, sample(false), "{\"step\": 6}", *world);
  auto wrong = sample(true);
  wrong[1] = whole("emb", at::zeros({10, 4}));
  e = error_of([&] { checkpoint::load(ok, wrong, *world); });
  EXPECT_NE(e.find("shape mismatch: emb (checkpoint [10, 3], model [10, 4])"), std::string::npos)
      << e;
  auto extra = sample(true);
  extra.push_back(whole("head", at::zeros({2})));
  e = error_of([&] { checkpoint::load(ok, extra, *world); });
  EXPECT_NE(e.find("missing: head"), std::string::npos) << e;
  auto fewer = sample(true);
  fewer.pop_back();
  e = error_of([&] { checkpoint::load(ok, fewer, *world); });
  EXPECT_NE(e.find("unexpected: optimizer.exp_avg.layers.0.w"), std::string::npos) << e;
  // strict: false lets optimizer state be missing (reported), never parameters.
  auto more_state = sample(true);
  more_state.push_back(whole("optimizer.exp_avg_sq.layers.0.w", at::zeros({4, 6})));
  EXPECT_THROW(checkpoint::load(ok, more_state, *world), UsageError);
  checkpoint::LoadOptions lax;
  lax.strict = false;
  const auto r = checkpoint::load(ok, more_state, *world, lax);
  EXPECT_EQ(r.missing_allowed, (std::vector<std::string>{"optimizer.exp_avg_sq.layers.0.w"}));
  EXPECT_TRUE(at::equal(more_state[1].local, sample(false)[1].local));
}

TEST(Checkpoint, ForeignDirectoryOfBoxesLoadsResharded) {
  // What PyTorch's HuggingFaceStorageWriter writes for a row-sharded 6x2 tensor: two files,
  // each one box with its saved_offsets, and no manifest.
  TempDir d;
  at::Tensor full = at::arange(12, at::kFloat).reshape({6, 2});
  nn::write_safetensors_file(d.path + "/shard-00001-model-00001-of-00001.safetensors",
                             {{"w", full.narrow(0, 0, 4).contiguous()}},
                             {{"DCP_SHARDING_INFO", "{\"w\": {\"saved_offsets\": [0, 0]}}"}},
                             false);
  nn::write_safetensors_file(d.path + "/shard-00002-model-00001-of-00001.safetensors",
                             {{"w", full.narrow(0, 4, 2).contiguous()}},
                             {{"DCP_SHARDING_INFO", "{\"w\": {\"saved_offsets\": [4, 0]}}"}},
                             false);
  auto world = comm::World::simulated(0, 1);
  // This "rank" holds rows [3, 6): it spans both saved boxes.
  checkpoint::TensorShard mine{"w", at::zeros({3, 2}), {6, 2}, {{{3, 3}}, {{0, 2}}}, true};
  const auto r = checkpoint::load(d.path, {mine}, *world);
  EXPECT_TRUE(r.foreign);
  EXPECT_TRUE(at::equal(mine.local, full.narrow(0, 3, 3)));
}
