#pragma once
// Checkpoints in the training loop (config section checkpoint, see config.h):
// - resume(): checkpoint.resume auto loads the newest complete checkpoint in checkpoint.dir
//   (if any), PATH loads that one, never starts fresh; model, optimizer state, the step and
//   the data position (samples consumed) come back, resharded to this run's layout; the
//   data loader continues from that position, so the run takes exactly the batches an
//   uninterrupted one takes (data/data_loader.h).
// - after_step(): saves every checkpoint.interval steps, and when `force` (preemption);
//   synchronously, or in the background with checkpoint.async.
// - finish(): waits for a save in flight (end of training, preemption).
// The non-tensor state (hyperpar_state.json): step, optimizer steps, seed, the data position
// (samples consumed, epoch and index in it; DataLoader::state_json), world size and layout,
// the model and train settings, hyperpar's version. The learning-rate schedule is a function
// of the step; the only randomness (init) is counter-based, so no RNG state is needed.
#include <memory>
#include <string>

#include "hyperpar/checkpoint/async_saver.h"
#include "hyperpar/data/data_loader.h"
#include "hyperpar/optim/optimizer.h"
#include "hyperpar/train/config.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

class TrainCheckpointer {
 public:
  TrainCheckpointer(const Config& c, ParallelModel& pm, optim::Optimizer& opt, comm::World& world,
                    data::DataLoader& data);
  /// The step training resumes after (0: fresh start).
  int64_t resume();
  /// Saves when `step` is due or `force`; returns the path being written ("" if none).
  std::string after_step(int64_t step, bool force);
  /// Waits for an asynchronous save; returns its path ("" if none was in flight).
  std::string finish();
  /// Seconds the last after_step() spent saving (the step-time cost of a save).
  double last_save_seconds() const { return last_save_s_; }

 private:
  std::string state_json(int64_t step) const;
  const Config& c_;
  ParallelModel& pm_;
  optim::Optimizer& opt_;
  comm::World& world_;
  data::DataLoader& data_;
  checkpoint::AsyncSaver async_;
  double last_save_s_ = 0;
};

}  // namespace hyperpar::train
