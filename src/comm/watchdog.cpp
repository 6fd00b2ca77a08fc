#include "hyperpar/comm/watchdog.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "hyperpar/comm/run_main.h"

namespace hyperpar::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  std::string what;
  Clock::time_point start;
};

// Never destroyed: the detached checker thread may run while static destructors do.
struct State {
  std::mutex mu;
  std::map<uint64_t, Entry> in_flight;  // ordered by id = issue order
  uint64_t next_id = 1;
  double timeout_s = kDefaultInitTimeoutS;
  std::string setting = "comm.init_timeout_s (default)";
  bool thread_started = false;
};

State& state() {
  static auto* s = new State;
  return *s;
}

void check_forever() {
  State& s = state();
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::string message;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      const auto now = Clock::now();
      for (const auto& [id, e] : s.in_flight) {
        const double waited = std::chrono::duration<double>(now - e.start).count();
        if (waited <= s.timeout_s) continue;
        char secs[64];
        std::snprintf(secs, sizeof(secs), "%.1f", waited);
        char limit[64];
        std::snprintf(limit, sizeof(limit), "%g", s.timeout_s);
        message = "collective watchdog: " + e.what + " did not complete within " + limit + " s (" +
                  s.setting + "); waited " + secs +
                  " s. A peer in this group is stopped, hung or dead, or issued a different "
                  "collective.";
        break;
      }
    }
    if (!message.empty()) exit_with_fatal_error("timeout", message, 1);
  }
}

}  // namespace

void set_collective_timeout(double seconds, const std::string& setting) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timeout_s = seconds;
  s.setting = setting;
}

double collective_timeout_s() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.timeout_s;
}

uint64_t watch_begin(std::string what) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.thread_started) {
    s.thread_started = true;
    std::thread(check_forever).detach();
  }
  const uint64_t id = s.next_id++;
  s.in_flight.emplace(id, Entry{std::move(what), Clock::now()});
  return id;
}

void watch_end(uint64_t id) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.in_flight.erase(id);
}

}  // namespace hyperpar::comm
