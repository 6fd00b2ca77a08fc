#include "hyperpar/core/process_memory.h"

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
}  // namespace

double resident_mb() { return status_field_mb("VmRSS:"); }
double peak_resident_mb() { return status_field_mb("VmHWM:"); }

}  // namespace hyperpar
