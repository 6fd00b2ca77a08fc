#include "hyperpar/train/output_path.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "hyperpar/train/config.h"

namespace hyperpar::train {
namespace {

ConfigError not_writable(const std::string& flag, const std::string& path, int err) {
  return ConfigError(flag + " " + path + " is not writable: " + std::strerror(err));
}

}  // namespace

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec) throw ConfigError(flag + " " + path + ": cannot create its directory: " + ec.message());
  if (fs::is_directory(p, ec))
    throw ConfigError(flag + " " + path + " is a directory; give a file path");
  // Root passes access(W_OK) almost everywhere: really open something.
  if (fs::exists(p, ec)) {
    const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) throw not_writable(flag, path, errno);
    close(fd);
    return;
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::string probe = (dir / ("." + p.filename().string() + ".probe-XXXXXX")).string();
  const int fd = mkostemp(probe.data(), O_CLOEXEC);  // fills in the X's
  if (fd < 0) throw not_writable(flag, path, errno);
  close(fd);
  unlink(probe.c_str());
}

}  // namespace hyperpar::train
