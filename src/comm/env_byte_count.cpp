#include "env_byte_count.h"

#include <cstdlib>
#include <exception>

#include "hyperpar/core/error.h"

namespace hyperpar::comm {

std::optional<size_t> env_byte_count(const std::string& name, const char* zero_means) {
  const char* raw = std::getenv(name.c_str());
  if (!raw || !*raw) return std::nullopt;
  const std::string value(raw);
  std::optional<unsigned long long> n;
  if (value.find_first_not_of("0123456789") == std::string::npos) {
    try {
      n = std::stoull(value);
    } catch (const std::exception&) {  // out of range: reported below like any bad value
    }
  }
  if (zero_means) {
    HP_CHECK(n.has_value(), name, " must be a byte count (digits only, 0 ", zero_means, "), got '",
             value, "'");
  } else {
    HP_CHECK(n.has_value() && *n > 0, name, " must be a positive byte count, got '", value, "'");
  }
  return static_cast<size_t>(*n);
}

}  // namespace hyperpar::comm
