#pragma once
// A fresh directory under /tmp for one test, removed with everything in it afterwards.
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace hyperpar::testing {

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/hp_test_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace hyperpar::testing
