#pragma once
// The training loop: per step, this rank's rows of the global batch in micro-batches
// (gradient sync only on the last), mean next-token loss scaled by 1/micro_batches,
// global grad-norm clipping, AdamW/SGD with linear warmup. Rank 0 prints one line per step
// and, with a metrics path, writes one JSON object per step. With checkpoint.dir, it resumes,
// saves and handles preemption (train/checkpointing.h, train/preemption.h): a SIGTERM/SIGINT
// ends training after the current step with a checkpoint, by throwing Preempted.
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
  std::vector<StepMetrics> steps;        // the steps this run took (after a resume: from there on)
  int64_t resumed_from_step = 0;         // 0: a fresh start
  std::vector<std::string> checkpoints;  // saved (or, async, being saved) by this run
};

TrainResult run_training(const Config& c, ParallelModel& pm, comm::World& world,
                         const std::string& metrics_path = "", bool print = true);

/// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();

}  // namespace hyperpar::train
