#pragma once
// Work: handle of one enqueued collective. wait() blocks until the output buffers hold the
// result (and any finishing step, such as the single division of an average, is done).
// Threading contract: wait() is called on the thread that issued the collective.
#include <functional>
#include <memory>

namespace hyperpar::comm {

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

/// A Work that is already complete (synchronous calls, single-rank groups).
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

/// Base of the backends' handles: once the backend reports completion, runs the finishing
/// step (an average's division, releasing kept buffers) exactly once. A failed wait counts as
/// finished (the error is thrown once). Subclass destructors call wait_unless_done(), so a
/// handle dropped without wait() never leaves its buffers to a collective still running.
class FinishingWork : public Work {
 public:
  explicit FinishingWork(std::function<void()> on_done) : on_done_(std::move(on_done)) {}
  void wait() final {
    if (done_) return;
    try {
      backend_wait();
    } catch (...) {
      done_ = true;
      throw;
    }
    finish();
  }
  bool is_completed() final {
    if (!done_ && backend_test()) finish();
    return done_;
  }

 protected:
  virtual void backend_wait() = 0;
  virtual bool backend_test() = 0;
  virtual void on_finished() {}
  void wait_unless_done() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }

 private:
  void finish() {
    done_ = true;
    if (on_done_) on_done_();
    on_finished();
  }
  std::function<void()> on_done_;
  bool done_ = false;
};

}  // namespace hyperpar::comm
