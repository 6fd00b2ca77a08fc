#include "hyperpar/core/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <string>

namespace hyperpar {

bool keep_freed_memory_for_reuse() {
  const char* v = std::getenv("HYPERPAR_MALLOC");
  if (v && std::string(v) == "default") return false;
  // Setting either also turns off glibc's dynamic threshold adjustment.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace hyperpar
