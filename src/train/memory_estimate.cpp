#include "hyperpar/train/memory_estimate.h"

#include <cstdio>

#include "hyperpar/comm/world.h"
#include "hyperpar/core/process_memory.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

MemoryEstimate estimate_memory(const Config& c, int64_t rank, int64_t world_size) {
  auto pm = build_parallel_model(c, comm::World::simulated(rank, world_size), false);
  MemoryEstimate e;
  for (auto& [name, p] : pm.model->named_parameters())
    e.parameters += static_cast<double>(p->data.numel()) * 4.0;  // fp32 shards
  e.gradients = e.parameters;
  e.optimizer_state = (c.train.optimizer == "adamw" ? 2.0 : 1.0) * e.parameters;
  return e;
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024));
  return buf;
}

void check_memory_fits(const MemoryEstimate& e, int64_t rank, int64_t local_ranks) {
  const double avail = available_memory_bytes();
  if (avail < 0) return;
  const double share = avail / static_cast<double>(local_ranks > 0 ? local_ranks : 1);
  if (e.total() <= share) return;
  std::string where = "available";
  if (local_ranks > 1)
    where += " (" + format_bytes(avail) + " on this machine shared by " +
             std::to_string(local_ranks) + " local ranks)";
  throw UsageError("rank " + std::to_string(rank) + " needs " + format_bytes(e.total()) +
                   " for its shards (parameters " + format_bytes(e.parameters) + ", gradients " +
                   format_bytes(e.gradients) + ", optimizer state " +
                   format_bytes(e.optimizer_state) + "), " + format_bytes(share) + " " + where +
                   "; use more ranks, a smaller model, or SGD");
}

}  // namespace hyperpar::train
