#include "hyperpar/core/process_memory.h"

#include <algorithm>
#include <fstream>
#include <string>

namespace hyperpar {
namespace {
double status_field_mb(const char* field) {
  std::ifstream f("/proc/self/status");
  const std::string key = field;
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size())) / 1024.0;
  return -1;
}
double read_number(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v == "max") return -1;
  try {
    return std::stod(v);
  } catch (const std::exception&) {
    return -1;
  }
}
}  // namespace

double available_memory_bytes() {
  double avail = -1;
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) avail = std::stod(line.substr(13)) * 1024.0;
  // cgroup v2: this process's group (a container or a systemd slice) may be limited.
  std::ifstream cg("/proc/self/cgroup");
  std::string entry;
  while (std::getline(cg, entry)) {
    if (entry.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + entry.substr(3);
    const double max = read_number(dir + "/memory.max");
    const double cur = read_number(dir + "/memory.current");
    if (max > 0 && cur >= 0) avail = avail < 0 ? max - cur : std::min(avail, max - cur);
  }
  return avail;
}

double resident_mb() { return status_field_mb("VmRSS:"); }
double peak_resident_mb() { return status_field_mb("VmHWM:"); }

}  // namespace hyperpar
