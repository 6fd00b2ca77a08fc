#include "hyperpar/comm/traffic.h"

#include <atomic>
#include <mutex>

namespace hyperpar::comm {
namespace {

std::atomic<bool> recording{false};
std::mutex table_mutex;  // collectives may be issued from more than one thread

TrafficTable& table() {
  static TrafficTable t;
  return t;
}

std::string& current_scope() {
  thread_local std::string scope = "other";
  return scope;
}

}  // namespace

void set_traffic_recording(bool on) { recording = on; }
bool traffic_recording() { return recording; }

void record_traffic(const std::string& op, double bytes) {
  if (!recording) return;
  std::lock_guard<std::mutex> lock(table_mutex);
  TrafficCount& c = table()[{current_scope(), op}];
  ++c.calls;
  c.bytes += bytes;
}

void record_traffic_bound(const std::string& op, double bytes) {
  if (!recording) return;
  std::lock_guard<std::mutex> lock(table_mutex);
  TrafficCount& c = table()[{current_scope(), op}];
  c.bound += bytes;
  c.bounded = true;
}

TrafficTable take_traffic() {
  std::lock_guard<std::mutex> lock(table_mutex);
  TrafficTable out;
  out.swap(table());
  return out;
}

TrafficScope::TrafficScope(std::string name) : previous_(std::move(current_scope())) {
  current_scope() = std::move(name);
}
TrafficScope::~TrafficScope() { current_scope() = std::move(previous_); }

const std::string& TrafficScope::current() { return current_scope(); }

}  // namespace hyperpar::comm
