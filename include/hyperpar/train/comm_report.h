#pragma once
// hyperpar-train --comm-report: what every rank communicates per step, per module group
// (traffic scope, comm/traffic.h) and collective, next to the least its layout needs.
//
//   CommReport report(c, pm);            // the layout's bounds, from the config and model
//   for each step: report.begin_step(); ... train ... report.end_step();
//   std::string json = report.finish(*world_group);  // collective; rank 0 prints the table
//
// Steps after the first of the run are averaged (the first also counts when it is the only
// one); evaluation passes are not counted. Bounds, per step (bytes this rank must send):
//   fsdp <module>   FSDPHandle::traffic_lower_bound (parallel/fsdp.h)
//   tp layers.L     dense blocks: the Megatron minimum, 4 all-reduces of the block's
//                   activations X = rows x seq x dim (attention and MLP, forward and
//                   backward) = 8 (t-1)/t X; with sequence parallel 4 all-gathers and 4
//                   reduce-scatters of (t-1)/t X, and the norms' weight-gradient all-reduces
//   tp tok_embeddings   one all-reduce of X (sequence parallel: a reduce-scatter and, for
//                   its gradient, an all-gather of (t-1)/t X)
//   tp output       the input's gradient all-reduce (SP: all-gather and reduce-scatter) and
//                   the logits' all-gather, (t-1)/t x rows x seq x vocab
//   ep <moe>        the routed rows that must leave the rank, one per token and other rank
//                   owning one of its experts, each way, and a routing entry (row, weight)
//                   per pair routed to another rank (parallel/expert_parallel.h)
// MoE blocks under tensor parallel, pipeline sends and the trainer's own scalars have no
// bound (shown as "-").
#include <string>

#include "hyperpar/comm/communicator.h"
#include "hyperpar/comm/traffic.h"
#include "hyperpar/train/config.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

/// The layout's least bytes per step per (scope, op), as described above.
comm::TrafficTable layout_traffic_bounds(const Config& c, const ParallelModel& pm);

class CommReport {
 public:
  CommReport(const Config& c, const ParallelModel& pm);
  /// Starts recording (first call) and drops what was counted since the last end_step.
  void begin_step();
  /// Takes the step's counts; returns this rank's bytes of the step.
  double end_step();
  /// Collective over `world` (every rank calls it): rank 0 prints every rank's table to
  /// stdout when `print` and returns the report as one JSON object; others return "".
  std::string finish(comm::Communicator& world, bool print);

 private:
  comm::TrafficTable bounds_;
  comm::TrafficTable sum_, first_;
  int64_t steps_ = 0;
};

}  // namespace hyperpar::train
