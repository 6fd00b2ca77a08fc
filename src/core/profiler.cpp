#include "hyperpar/core/profiler.h"

#include <atomic>
#include <chrono>
#include <mutex>

namespace hyperpar::profile {
namespace {

std::atomic<bool> on{false};
std::mutex events_mutex;  // waits may complete on other threads

std::vector<Event>& events() {
  static std::vector<Event> e;
  return e;
}

}  // namespace

void set_enabled(bool enable) { on.store(enable, std::memory_order_relaxed); }
bool enabled() { return on.load(std::memory_order_relaxed); }

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void complete(std::string name, const char* category, int64_t begin_us, int64_t end_us, int track,
              std::string detail) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(events_mutex);
  events().push_back(Event{std::move(name), category, std::move(detail), begin_us, end_us, track});
}

std::vector<Event> take_events() {
  std::lock_guard<std::mutex> lock(events_mutex);
  std::vector<Event> out;
  out.swap(events());
  return out;
}

}  // namespace hyperpar::profile
