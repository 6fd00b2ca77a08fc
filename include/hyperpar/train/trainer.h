#pragma once
// The training loop: per step, this rank's rows of the global batch in micro-batches
// (gradient sync only on the last), mean next-token loss scaled by 1/micro_batches,
// global grad-norm clipping, AdamW/SGD with linear warmup. Rank 0 prints one line per step
// and, with a metrics path, writes one JSON object per step.
#include <functional>
#include <string>
#include <vector>

#include "hyperpar/train/config.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

struct StepMetrics {
  int64_t step;
  double loss, grad_norm, lr, tokens_per_s, step_time_s, peak_rss_mb;
};

struct TrainResult {
  std::vector<StepMetrics> steps;
};

TrainResult run_training(const Config& c, ParallelModel& pm, comm::World& world,
                         const std::string& metrics_path = "", bool print = true);

/// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();

}  // namespace hyperpar::train
