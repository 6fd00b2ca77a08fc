#pragma once
// This process's resident memory from /proc/self/status, in MiB (-1 where unavailable).
namespace hyperpar {

double resident_mb();       // VmRSS: now
double peak_resident_mb();  // VmHWM: the high-water mark since start

}  // namespace hyperpar
