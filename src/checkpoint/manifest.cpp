#include "hyperpar/checkpoint/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "hyperpar/core/error.h"

namespace hyperpar::checkpoint {

FileDigest digest_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK(fd >= 0, "checkpoint: cannot open ", path, ": ", std::strerror(errno));
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> st(XXH64_createState(),
                                                                &XXH64_freeState);
  XXH64_reset(st.get(), 0);
  std::vector<char> buf(1 << 20);
  FileDigest d;
  while (true) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      throw Error("checkpoint: reading " + path + " failed: " + std::strerror(errno));
    }
    if (n == 0) break;
    XXH64_update(st.get(), buf.data(), static_cast<size_t>(n));
    d.bytes += static_cast<uint64_t>(n);
  }
  close(fd);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(XXH64_digest(st.get())));
  d.xxh64 = hex;
  return d;
}

void write_manifest(const std::string& path, const Manifest& m) {
  std::ostringstream os;
  os << "{\"format\": \"hyperpar-checkpoint\", \"version\": 1, \"files\": {";
  bool first = true;
  for (const auto& [name, d] : m) {
    os << (first ? "\n" : ",\n") << "  \"" << name << "\": {\"bytes\": " << d.bytes
       << ", \"xxh64\": \"" << d.xxh64 << "\"}";
    first = false;
  }
  os << "\n}}\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << os.str();
    f.flush();
    HP_CHECK(f.good(), "checkpoint: writing ", tmp, " failed");
  }
  fsync_path(tmp);
  HP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "checkpoint: cannot rename ", tmp);
}

Manifest read_manifest(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    throw UsageError("checkpoint: cannot read manifest " + path + ": " + e.what());
  }
  if (!root["files"] || !root["files"].IsMap())
    throw UsageError("checkpoint: " + path + " is not a hyperpar manifest (no \"files\")");
  Manifest m;
  for (const auto& kv : root["files"])
    m[kv.first.as<std::string>()] =
        FileDigest{kv.second["bytes"].as<uint64_t>(), kv.second["xxh64"].as<std::string>()};
  return m;
}

std::vector<std::string> verify(const std::string& dir, const Manifest& m,
                                const std::vector<std::string>& files) {
  std::vector<std::string> problems;
  auto check = [&](const std::string& name, const FileDigest& want) {
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      problems.push_back(path + " is missing (manifest: " + std::to_string(want.bytes) +
                         " bytes, xxh64 " + want.xxh64 + ")");
      return;
    }
    if (static_cast<uint64_t>(st.st_size) != want.bytes) {
      problems.push_back(path + " has " + std::to_string(st.st_size) +
                         " bytes, the manifest says " + std::to_string(want.bytes) +
                         " (truncated or replaced)");
      return;
    }
    const FileDigest got = digest_file(path);
    if (got.xxh64 != want.xxh64)
      problems.push_back(path + " has xxh64 " + got.xxh64 + ", the manifest says " + want.xxh64 +
                         " (altered)");
  };
  if (files.empty()) {
    for (const auto& [name, d] : m) check(name, d);
  } else {
    for (const auto& name : files) {
      auto it = m.find(name);
      if (it != m.end()) check(name, it->second);
    }
  }
  return problems;
}

void fsync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK(fd >= 0, "checkpoint: cannot open ", path, " to fsync: ", std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  HP_CHECK(rc == 0, "checkpoint: fsync of ", path, " failed: ", std::strerror(errno));
}

}  // namespace hyperpar::checkpoint
