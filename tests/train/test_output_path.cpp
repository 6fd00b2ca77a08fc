// The output-path check every rank runs before training (train/output_path.h): it must never
// create, truncate or remove the path itself, since rank 0 may already have opened it.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "hyperpar/train/config.h"
#include "hyperpar/train/output_path.h"

using namespace hyperpar;

namespace {

// Names of the entries created or deleted in `dir` while `body` runs (inotify, no timing).
template <class F>
std::vector<std::string> entries_touched(const std::string& dir, F body) {
  const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_GE(inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_DELETE | IN_MODIFY), 0);
  body();
  std::vector<std::string> names;
  alignas(inotify_event) char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;)
    for (char* p = buf; p < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      names.push_back(e->len ? e->name : "");
      p += sizeof(inotify_event) + e->len;
    }
  close(fd);
  return names;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(OutputPath, MissingFileIsProbedBesideItNeverCreatedOrRemoved) {
  hyperpar::testing::TempDir tmp;
  const std::string target = tmp.path + "/metrics.jsonl";
  const auto touched =
      entries_touched(tmp.path, [&] { train::check_output_path("--metrics", target); });
  EXPECT_FALSE(touched.empty()) << "the directory was really written to (a probe file)";
  for (const auto& name : touched) EXPECT_NE(name, "metrics.jsonl") << "the target was touched";
  EXPECT_FALSE(std::filesystem::exists(target));
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path)) << "the probe file was removed";
}

TEST(OutputPath, FileAnotherRankIsWritingSurvivesTheCheck) {
  hyperpar::testing::TempDir tmp;
  const std::string target = tmp.path + "/metrics.jsonl";
  std::ofstream rank0(target, std::ios::trunc);  // rank 0 opened it before this rank checks
  rank0 << "{\"step\": 1}\n" << std::flush;
  const auto inode = [&] {
    struct stat st {};
    EXPECT_EQ(stat(target.c_str(), &st), 0);
    return st.st_ino;
  };
  const auto inode_before = inode();
  const auto touched =
      entries_touched(tmp.path, [&] { train::check_output_path("--metrics", target); });
  EXPECT_TRUE(touched.empty()) << touched.front();
  rank0 << "{\"step\": 2}\n" << std::flush;
  EXPECT_EQ(inode(), inode_before) << "the path still names the file rank 0 writes";
  EXPECT_EQ(slurp(target), "{\"step\": 1}\n{\"step\": 2}\n");
}

TEST(OutputPath, CreatesMissingDirectories) {
  hyperpar::testing::TempDir tmp;
  const std::string target = tmp.path + "/runs/a/metrics.jsonl";
  train::check_output_path("--metrics", target);
  EXPECT_TRUE(std::filesystem::is_directory(tmp.path + "/runs/a"));
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path + "/runs/a"));
}

TEST(OutputPath, BadPathsAreConfigErrorsNamingFlagAndPath) {
  hyperpar::testing::TempDir tmp;
  const auto error_of = [](const std::string& flag, const std::string& path) -> std::string {
    try {
      train::check_output_path(flag, path);
    } catch (const train::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of("--metrics", tmp.path),
            "--metrics " + tmp.path + " is a directory; give a file path");
  EXPECT_NE(error_of("--profile", "/proc/hp_trace.json")
                .find("--profile /proc/hp_trace.json is not writable: "),
            std::string::npos);
  const std::string under_file = tmp.path + "/f";
  std::ofstream(under_file) << "x";
  EXPECT_NE(error_of("--metrics", under_file + "/m.jsonl").find("cannot create its directory"),
            std::string::npos);
  EXPECT_EQ(error_of("--metrics", ""), "");
}
