#pragma once
// CPU seconds this process has used so far, all threads (CLOCK_PROCESS_CPUTIME_ID): the
// trainer reports each step's CPU time, summed over ranks, next to its wall time.
#include <time.h>

namespace hyperpar {

inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace hyperpar
