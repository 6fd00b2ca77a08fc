#pragma once
// Work: handle of one enqueued collective. wait() blocks until the output buffers hold the
// result (and any finishing step, such as the single division of an average, is done).
// Threading contract: wait() is called on the thread that issued the collective.
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

}  // namespace hyperpar::comm
