#include "hyperpar/checkpoint/async_saver.h"

#include "collective_status.h"
#include "hyperpar/core/error.h"
#include "staged_save.h"

namespace hyperpar::checkpoint {

AsyncSaver::AsyncSaver() : pool_(std::make_unique<StagingPool>()) {}

AsyncSaver::~AsyncSaver() {
  // Without the world at hand no collective is possible: just let the files be finished.
  if (thread_.joinable()) thread_.join();
}

void AsyncSaver::start(const std::string& dir, int64_t step, const std::vector<TensorShard>& shards,
                       const std::string& state_json, comm::World& world, const SaveOptions& o,
                       double wait_s) {
  wait(world);
  staged_ = std::make_unique<StagedSave>(
      stage_save(dir, step, shards, state_json, world, o, pool_.get()));
  error_.clear();
  thread_ = std::thread([this, wait_s] {
    try {
      write_staged(*staged_);
      if (staged_->rank == 0) finalise_staged(*staged_, wait_s);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  });
}

std::string AsyncSaver::wait(comm::World& world) {
  if (!thread_.joinable()) return "";
  thread_.join();
  const std::string path = staged_->final_path;
  const int64_t step = staged_->step;
  staged_.reset();
  if (!detail::all_ok(world, error_.empty(), "checkpoint async save"))
    throw Error("asynchronous checkpoint save of step " + std::to_string(step) + " failed" +
                (error_.empty() ? " on another rank (see its log)" : ": " + error_) +
                "; the previous complete checkpoint is untouched");
  return path;
}

}  // namespace hyperpar::checkpoint
