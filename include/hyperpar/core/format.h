#pragma once
// Integer lists as text, the one way hyperpar prints them (messages, JSON): "[4, 5, 6]".
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace hyperpar {

inline std::string format_list(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

}  // namespace hyperpar
