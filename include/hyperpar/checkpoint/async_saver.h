#pragma once
// Asynchronous checkpoint saves (checkpoint.async: true). start() runs on the training
// thread: it agrees on the directory with the other ranks (one broadcast) and copies this
// rank's boxes into staging tensors (allocated by the first save, reused by the next ones),
// then returns; a background thread writes and fsyncs
// the files, and on rank 0 waits for every rank's files (through their rank manifests, so
// that the background threads never issue a collective) and finalises the checkpoint.
// wait() (the next start(), the end of training, the destructor) joins the thread and, as a
// collective, raises on every rank if any rank's save failed.
//
//   AsyncSaver saver;
//   saver.start("ckpt", step, shards, state_json, world, opts, /*wait_s=*/100);  // returns fast
//   ... next steps ...
//   saver.wait(world);  // DIR/step-N is complete (or every rank threw)
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hyperpar/checkpoint/checkpoint.h"

namespace hyperpar::checkpoint {

struct StagedSave;
using StagingPool = std::map<std::string, at::Tensor>;

class AsyncSaver {
 public:
  AsyncSaver();
  ~AsyncSaver();
  /// Waits for the previous save, then stages and starts this one.
  void start(const std::string& dir, int64_t step, const std::vector<TensorShard>& shards,
             const std::string& state_json, comm::World& world, const SaveOptions& o,
             double wait_s);
  /// Collective when a save is in flight: joins it; throws on every rank if one failed.
  /// Returns the completed checkpoint's path ("" when nothing was in flight).
  std::string wait(comm::World& world);
  bool in_flight() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::unique_ptr<StagedSave> staged_;
  std::unique_ptr<StagingPool> pool_;  // staging buffers, reused by every later save
  std::string error_;
};

}  // namespace hyperpar::checkpoint
