// Token files, window permutation, windows and the data loader, in one process.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <set>

#include "common/temp_dir.h"
#include "hyperpar/core/error.h"
#include "hyperpar/data/data_loader.h"
#include "hyperpar/data/token_file.h"
#include "hyperpar/data/window_permutation.h"

using namespace hyperpar;
using data::TokenFormat;

namespace {

std::vector<uint32_t> iota_ids(size_t n, uint32_t mod) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i % mod);
  return v;
}

void write(const std::string& path, TokenFormat f, const std::vector<uint32_t>& ids,
           bool wide = false) {
  data::TokenFileWriter w(path, f, wide);
  w.append(ids.data(), ids.size());
  w.finish();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokenFile, EveryFormatRoundTrips) {
  hyperpar::testing::TempDir tmp;
  const auto ids = iota_ids(1000, 300);
  for (auto [f, wide, auto_ok] :
       {std::tuple{TokenFormat::kU16, false, false}, std::tuple{TokenFormat::kU32, false, false},
        std::tuple{TokenFormat::kLlmc, false, true}, std::tuple{TokenFormat::kLlmc, true, true}}) {
    const std::string p = tmp.path + "/t" + data::token_format_name(f) + (wide ? "w" : "");
    write(p, f, ids, wide);
    const data::TokenFile file(p, auto_ok ? TokenFormat::kAuto : f);
    EXPECT_EQ(file.format(), f);
    EXPECT_EQ(file.size(), 1000);
    EXPECT_EQ(file.bytes_per_token(), f == TokenFormat::kU32 || wide ? 4 : 2);
    std::vector<int64_t> got(10);
    file.read(295, 10, got.data());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], (295 + i) % 300);
    const auto [max, at] = file.max_in(0, 1000);
    EXPECT_EQ(max, 299u);
    EXPECT_EQ(at, 299);
  }
}

TEST(TokenFile, BadFilesAreClearErrors) {
  hyperpar::testing::TempDir tmp;
  const std::string raw = tmp.path + "/raw.bin";
  write(raw, TokenFormat::kU16, iota_ids(100, 50));
  EXPECT_NE(
      error_of([&] { data::TokenFile(raw, TokenFormat::kAuto); }).find("set data.format to u16"),
      std::string::npos);
  EXPECT_NE(error_of([&] { data::TokenFile(raw, TokenFormat::kLlmc); }).find("no llm.c header"),
            std::string::npos);
  {  // odd byte count for u32
    std::ofstream f(tmp.path + "/odd.bin", std::ios::binary);
    f << "abcdef";
  }
  EXPECT_NE(error_of([&] {
              data::TokenFile(tmp.path + "/odd.bin", TokenFormat::kU32);
            }).find("6 bytes is not a whole number of 4-byte tokens"),
            std::string::npos);
  // A truncated llm.c file: the header's count does not match the size.
  const std::string ll = tmp.path + "/ll.bin";
  write(ll, TokenFormat::kLlmc, iota_ids(100, 50));
  std::filesystem::resize_file(ll, 1024 + 150);
  EXPECT_NE(error_of([&] { data::TokenFile(ll, TokenFormat::kAuto); }).find("says 100 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              data::TokenFile(tmp.path + "/none.bin", TokenFormat::kU16);
            }).find("cannot open"),
            std::string::npos);
  // u16 cannot hold 70000.
  data::TokenFileWriter w(tmp.path + "/big.bin", TokenFormat::kU16);
  const uint32_t big = 70000;
  EXPECT_NE(error_of([&] { w.append(&big, 1); }).find("does not fit uint16"), std::string::npos);
}

TEST(WindowPermutation, IsABijectionThatChangesWithEpochAndSeed) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    const data::WindowPermutation p(n, 11, 0);
    std::vector<int64_t> img(n);
    for (int64_t i = 0; i < n; ++i) img[i] = p(i);
    std::vector<int64_t> sorted = img;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "n = " << n;
    if (n >= 64) {
      const data::WindowPermutation e1(n, 11, 1), s2(n, 12, 0);
      int64_t same_epoch = 0, same_seed = 0, fixed = 0;
      for (int64_t i = 0; i < n; ++i) {
        same_epoch += e1(i) == img[i];
        same_seed += s2(i) == img[i];
        fixed += img[i] == i;
      }
      // A random permutation agrees with another in about one place; allow a few.
      EXPECT_LT(same_epoch, 8) << n;
      EXPECT_LT(same_seed, 8) << n;
      EXPECT_LT(fixed, 8) << n;
    }
  }
  EXPECT_EQ(data::WindowPermutation(1000, 5, 3)(17), data::WindowPermutation(1000, 5, 3)(17));
}

TEST(TokenWindows, WindowsStayInsideTheirFile) {
  hyperpar::testing::TempDir tmp;
  // 100 and 40 tokens, seq_len 16: (99 / 16) = 6 and (39 / 16) = 2 windows.
  std::vector<uint32_t> a = iota_ids(100, 1000), b(40);
  for (int i = 0; i < 40; ++i) b[i] = 500 + i;
  write(tmp.path + "/a.bin", TokenFormat::kLlmc, a);
  write(tmp.path + "/b.bin", TokenFormat::kLlmc, b);
  std::vector<std::shared_ptr<const data::TokenFile>> files{
      std::make_shared<const data::TokenFile>(tmp.path + "/a.bin", TokenFormat::kAuto),
      std::make_shared<const data::TokenFile>(tmp.path + "/b.bin", TokenFormat::kAuto)};
  EXPECT_EQ(data::TokenWindows::count_windows(files, 16), 8);
  const data::TokenWindows all(files, 16), second(files, 16, 6, 2);
  EXPECT_EQ(all.size(), 8);
  std::vector<int64_t> w(17);
  all.read(5, w.data());  // tokens [80, 97) of a
  EXPECT_EQ(w.front(), 80);
  EXPECT_EQ(w.back(), 96);
  second.read(1, w.data());  // tokens [16, 33) of b
  EXPECT_EQ(w.front(), 516);
  EXPECT_EQ(w.back(), 532);
  const auto where = second.locate(1);
  EXPECT_EQ(where.first->path(), tmp.path + "/b.bin");
  EXPECT_EQ(where.second, 16);
}

class Loader : public ::testing::Test {
 protected:
  void SetUp() override {
    // 3 files of 1000 tokens, ids i mod 250: seq_len 9 gives 111 windows each.
    for (int f = 0; f < 3; ++f) {
      auto ids = iota_ids(1000, 250);
      for (auto& x : ids) x = (x + 7 * f) % 250;
      write(tmp.path + "/part-" + std::to_string(f) + ".bin", TokenFormat::kLlmc, ids);
    }
    dc.synthetic = false;
    dc.path = tmp.path + "/part-*.bin";
  }
  hyperpar::testing::TempDir tmp;
  data::DataConfig dc;
};

TEST_F(Loader, AnEpochVisitsEveryWindowOnceAndTheNextReshuffles) {
  // Every token distinct (ids 1000 f + i), so a window's first token names it.
  for (int f = 0; f < 3; ++f) {
    auto ids = iota_ids(1000, 1000);
    for (auto& x : ids) x += 1000 * f;
    write(tmp.path + "/part-" + std::to_string(f) + ".bin", TokenFormat::kLlmc, ids);
  }
  data::DataLoader dl(dc, 9, 3000, 3, 0, 0);
  ASSERT_EQ(dl.train_windows(), 333);
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int64_t step = 1; step <= 222; ++step) {
    const auto b = dl.train_rows(step, 0, 3);
    for (int r = 0; r < 3; ++r) {
      std::vector<int64_t> row(b.tokens[r].data_ptr<int64_t>(),
                               b.tokens[r].data_ptr<int64_t>() + 9);
      (step <= 111 ? epoch0 : epoch1).push_back(row);
      // Targets are the tokens shifted by one.
      EXPECT_TRUE(at::equal(b.targets[r].narrow(0, 0, 8), b.tokens[r].narrow(0, 1, 8)));
    }
  }
  std::set<std::vector<int64_t>> s0(epoch0.begin(), epoch0.end()), s1(epoch1.begin(), epoch1.end());
  EXPECT_EQ(s0.size(), 333u);
  EXPECT_EQ(s0, s1);          // the same windows ...
  EXPECT_NE(epoch0, epoch1);  // ... in another order
  const auto p = dl.position_after(112);
  EXPECT_EQ(p.consumed_samples, 336);
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.index, 3);
}

TEST_F(Loader, RowsDependOnlyOnTheStepAndResumeContinuesExactly) {
  data::DataLoader a(dc, 9, 250, 8, 3, 0), b(dc, 9, 250, 8, 3, 0);
  for (int64_t step = 1; step <= 5; ++step) {
    const auto whole = a.train_rows(step, 0, 8);
    // Any split into data-parallel rows gives the same rows.
    const auto lo = b.train_rows(step, 0, 3), hi = b.train_rows(step, 3, 5);
    EXPECT_TRUE(at::equal(whole.tokens, at::cat({lo.tokens, hi.tokens})));
  }
  data::DataLoader resumed(dc, 9, 250, 8, 3, 0);
  resumed.resume_after(3, a.position_after(3).consumed_samples);
  EXPECT_TRUE(at::equal(resumed.train_rows(4, 0, 8).tokens, a.train_rows(4, 0, 8).tokens));
  EXPECT_THROW(resumed.train_rows(3, 0, 8), Error);
  // The shuffle seed changes the order.
  data::DataConfig other = dc;
  other.shuffle_seed = 99;
  data::DataLoader c(other, 9, 250, 8, 3, 0);
  EXPECT_FALSE(at::equal(c.train_rows(1, 0, 8).tokens, a.train_rows(1, 0, 8).tokens));
}

TEST_F(Loader, ValidationSplitAndEvalBatches) {
  dc.val_fraction = 0.1;
  data::DataLoader dl(dc, 9, 250, 4, 0, 2);
  EXPECT_EQ(dl.val_windows(), 33);
  EXPECT_EQ(dl.train_windows(), 300);
  // Evaluation batches are fixed: the first windows of the validation part, in order: the
  // last 33 windows are the last file's windows 78..110, so batch 0 row 0 starts at token
  // 78 * 9 of part-2.
  const auto v = dl.val_rows(0, 0, 4);
  EXPECT_EQ(v.tokens[0][0].item<int64_t>(), (78 * 9 + 14) % 250);
  EXPECT_TRUE(at::equal(v.tokens, dl.val_rows(0, 0, 4).tokens));
  // Not enough validation windows for 20 batches of 4.
  EXPECT_NE(error_of([&] {
              data::DataLoader(dc, 9, 250, 4, 0, 20);
            }).find("the validation set has 33 windows; train.eval_batches 20"),
            std::string::npos);
  data::DataConfig no_val = dc;
  no_val.val_fraction = 0;
  EXPECT_NE(
      error_of([&] { data::DataLoader(no_val, 9, 250, 4, 0, 2); }).find("needs validation data"),
      std::string::npos);
}

TEST_F(Loader, TokensOutsideTheVocabularyNameFileAndOffset) {
  auto ids = iota_ids(1000, 250);
  ids[500] = 4000;
  write(tmp.path + "/part-1.bin", TokenFormat::kLlmc, ids);
  data::DataLoader dl(dc, 9, 250, 333, 0, 0);  // one step is the whole epoch
  const std::string e = error_of([&] { dl.train_rows(1, 0, 1); });
  EXPECT_NE(e.find("part-1.bin: token id 4000 at token offset 500 (byte offset 2024)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("model.vocab_size 250"), std::string::npos);
}

TEST_F(Loader, PathsAndGlobs) {
  EXPECT_EQ(data::expand_data_path(dc.path, "data.path").size(), 3u);
  EXPECT_EQ(data::expand_data_path(dc.path, "data.path").front(), tmp.path + "/part-0.bin");
  EXPECT_NE(error_of([&] {
              data::expand_data_path(tmp.path + "/nope*.bin", "data.path");
            }).find("matches no file"),
            std::string::npos);
  data::DataConfig small = dc;
  small.path = tmp.path + "/part-0.bin";
  EXPECT_NE(error_of([&] { data::DataLoader(small, 9, 250, 200, 0, 0); }).find("has 111 windows"),
            std::string::npos);
}

TEST(SyntheticData, TrainingAndValidationStreamsDiffer) {
  data::DataConfig dc;
  data::DataLoader dl(dc, 16, 64, 4, 7, 2);
  EXPECT_TRUE(dl.has_validation());
  EXPECT_FALSE(at::equal(dl.train_rows(1, 0, 4).tokens, dl.val_rows(0, 0, 4).tokens));
  EXPECT_TRUE(
      at::equal(dl.train_rows(1, 1, 2).tokens, dl.train_rows(1, 0, 4).tokens.narrow(0, 1, 2)));
}
