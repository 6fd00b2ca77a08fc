#pragma once
// This process's resident memory from /proc/self/status, in MiB (-1 where unavailable), and
// the memory still available to it.
namespace hyperpar {

double resident_mb();       // VmRSS: now
double peak_resident_mb();  // VmHWM: the high-water mark since start

/// Bytes this machine can still give the process: MemAvailable, capped by the cgroup v2
/// limit (memory.max - memory.current) when one is set. -1 where unknown.
double available_memory_bytes();

}  // namespace hyperpar
