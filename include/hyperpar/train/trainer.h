#pragma once
// The training loop: per step, this rank's rows of the global batch (data/data_loader.h)
// in micro-batches
// (gradient sync only on the last), mean next-token loss scaled by 1/micro_batches,
// global grad-norm clipping, AdamW/SGD with linear warmup. Rank 0 prints one line per step
// and, with a metrics path, writes one JSON object per step. With checkpoint.dir, it resumes,
// saves and handles preemption (train/checkpointing.h, train/preemption.h): a SIGTERM/SIGINT
// ends training after the current step with a checkpoint, by throwing Preempted.
// With train.eval_interval, every that many steps the mean loss over train.eval_batches fixed
// validation batches (no gradients; the same batches whatever the layout) is reported as
// val_loss in the progress line and the metrics.
// dump_first_batch DIR: at the first step this run takes (before its update), the first rank
// of each TP group writes DIR/rows-F.safetensors with its rows (F = the first row's index in
// the global batch) of that step: tokens, targets and logits (float32). It lets another
// implementation (transformers) check hyperpar's forward on exactly that batch.
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "hyperpar/data/data_loader.h"
#include "hyperpar/train/config.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

struct StepMetrics {
  int64_t step;
  double loss, grad_norm, lr, tokens_per_s, step_time_s, peak_rss_mb;
  double cpu_s;            // CPU seconds of the step, summed over all ranks
  double comm_bytes = -1;  // with TrainOptions::comm_report: this rank's bytes sent (-1: off)
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not evaluated this step
};

struct TrainOptions {
  std::string metrics_path;
  bool print = true;
  data::DataLoader* data = nullptr;  // null: opened from c.data
  std::string dump_first_batch;      // a directory ("" : none)
  /// Count every collective per module group (train/comm_report.h): each metrics line gets
  /// "comm_bytes" (rank 0's bytes of the step); at the end rank 0 prints every rank's table
  /// and appends {"comm_report": {...}} to the metrics file.
  bool comm_report = false;
  /// A path: record a timeline of every step (core/profiler.h) and write it there as one
  /// Chrome trace for all ranks (train/profile_trace.h); rank 0 prints the overlap summary.
  std::string profile_path;
};

struct TrainResult {
  std::vector<StepMetrics> steps;        // the steps this run took (after a resume: from there on)
  int64_t resumed_from_step = 0;         // 0: a fresh start
  std::vector<std::string> checkpoints;  // saved (or, async, being saved) by this run
  std::string comm_report;               // TrainOptions::comm_report: the JSON (rank 0)
};

TrainResult run_training(const Config& c, ParallelModel& pm, comm::World& world,
                         const TrainOptions& o);
inline TrainResult run_training(const Config& c, ParallelModel& pm, comm::World& world,
                                const std::string& metrics_path = "", bool print = true) {
  TrainOptions o;
  o.metrics_path = metrics_path;
  o.print = print;
  return run_training(c, pm, world, o);
}

/// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();

}  // namespace hyperpar::train
