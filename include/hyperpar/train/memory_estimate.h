#pragma once
// What one rank will hold for its shards, from the dry-run build (meta tensors only, no
// communication): parameters, their gradients and the optimizer state (AdamW: two moments;
// SGD: one momentum buffer), in bytes as doubles, so that absurd sizes (a dim of 10^9)
// print as large numbers instead of overflowing.
//
//   auto e = estimate_memory(cfg, /*rank=*/3, /*world_size=*/8);
//   check_memory_fits(e, 3, local_ranks);  // throws UsageError:
//   // "rank 3 needs 14.2 GiB for its shards (parameters 3.6 GiB, gradients 3.6 GiB,
//   //  optimizer state 7.1 GiB); 7.9 GiB available (MemAvailable shared by 8 local ranks)"
#include <cstdint>
#include <string>

#include "hyperpar/train/config.h"

namespace hyperpar::train {

struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double total() const { return parameters + gradients + optimizer_state; }
};

MemoryEstimate estimate_memory(const Config& c, int64_t rank, int64_t world_size);

/// "14.2 GiB" / "512.0 MiB".
std::string format_bytes(double bytes);

/// Throws UsageError when `e` exceeds this rank's share of the available memory (the
/// machine's available bytes split over `local_ranks` processes). No-op where unknown.
void check_memory_fits(const MemoryEstimate& e, int64_t rank, int64_t local_ranks);

}  // namespace hyperpar::train
