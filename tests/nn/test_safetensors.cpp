// safetensors export/import: byte layout, round trip, a hand-written file, and clear
// errors for mismatched names, shapes and truncated files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/layers.h"
#include "hyperpar/nn/safetensors.h"

using namespace hyperpar;

namespace {
std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("hp_st_" + std::to_string(getpid()) + name))
      .string();
}
void write_bytes(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header << data;
}
}  // namespace

TEST(Safetensors, RoundTripAndLayout) {
  nn::Linear a(3, 2, true), b(3, 2, true);
  a.init_weights(1);
  b.init_weights(2);
  const std::string path = tmp_path("rt");
  nn::save_safetensors(a, path);
  nn::load_safetensors(b, path);
  EXPECT_TRUE(a.param("weight").data.equal(b.param("weight").data));
  EXPECT_TRUE(a.param("bias").data.equal(b.param("bias").data));
  // Layout: u64 header length, JSON, 8-byte aligned data of 6 + 2 floats.
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), {});
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(all[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(all.size(), 8 + n + 8 * sizeof(float));
  const std::string header = all.substr(8, n);
  EXPECT_NE(header.find("\"weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"),
            std::string::npos)
      << header;
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::remove(path.c_str());
}

TEST(Safetensors, LoadsAHandWrittenFile) {
  // What any safetensors writer produces for weight [2,2] = {1,2,3,4} (F64, converted).
  const std::string path = tmp_path("hand");
  const double vals[4] = {1, 2, 3, 4};
  write_bytes(path, R"({"weight":{"dtype":"F64","shape":[2,2],"data_offsets":[0,32]}})",
              std::string(reinterpret_cast<const char*>(vals), sizeof(vals)));
  nn::Linear lin(2, 2, false);
  nn::load_safetensors(lin, path);
  EXPECT_TRUE(lin.param("weight").data.equal(at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2})));
  std::remove(path.c_str());
}

TEST(Safetensors, ClearErrors) {
  nn::Linear lin(2, 2, false);
  const std::string path = tmp_path("err");
  auto expect_error = [&](const std::string& needle) {
    try {
      nn::load_safetensors(lin, path);
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  write_bytes(path, R"({"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
              std::string(24, '\0'));
  expect_error("has shape [2, 3]");
  write_bytes(path, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
              std::string(16, '\0'));
  expect_error("missing: weight unexpected: w");
  write_bytes(path, R"({"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
              std::string(8, '\0'));
  expect_error("inconsistent data_offsets");
  { std::ofstream(path) << "abc"; }
  expect_error("too short");
  std::remove(path.c_str());
  EXPECT_THROW(nn::load_safetensors(lin, path), Error);  // missing file
}
