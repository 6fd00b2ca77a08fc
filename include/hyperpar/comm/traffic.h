#pragma once
// Communication traffic recorder (hyperpar-train --comm-report; PyTorch's CommDebugMode
// counts the same). While recording is on, every collective this process issues is counted
// under the current traffic scope (the module group that issued it: "fsdp layers.0",
// "tp layers.1", "ep layers.1.moe", "train"; "other" outside any scope) and its op, as calls
// and as the bytes this rank must send under the ring/pairwise algorithms (n = group size):
//   all_gather_into_tensor   (n - 1) x input bytes
//   reduce_scatter_tensor    (n - 1) x output bytes
//   all_reduce               2 (n - 1) / n x bytes
//   all_to_all_single        bytes of the input rows addressed to the other ranks
//   broadcast                bytes on the root (n > 1), 0 elsewhere
//   send                     bytes; recv and barrier count calls only
// These are the quantities the layouts' lower bounds are stated in (FSDP: (N - 1) / N x
// Psi x bytes per all-gather), so "bytes / bound" is the overhead a layout adds (padding,
// repeated gathers, duplicated rows). Code that knows a bound for its own traffic at run
// time (expert parallel: the rows that must leave the rank) adds it with
// record_traffic_bound under the same scope.
//
//   comm::set_traffic_recording(true);
//   { comm::TrafficScope s("fsdp layers.0"); group->all_gather_into_tensor(out, in); }
//   comm::TrafficTable t = comm::take_traffic();  // t[{"fsdp layers.0", "all_gather..."}]
//
// Scopes are per thread (collectives are issued on the thread that runs forward and, on CPU,
// backward); code whose backward runs later captures current() and re-enters it there.
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace hyperpar::comm {

struct TrafficCount {
  int64_t calls = 0;
  double bytes = 0;
  double bound = 0;      // lower bound of bytes, where one is known
  bool bounded = false;  // bound is set
};

/// (scope, op) -> counts.
using TrafficTable = std::map<std::pair<std::string, std::string>, TrafficCount>;

void set_traffic_recording(bool on);
bool traffic_recording();

/// Counts one call of `op` moving `bytes` (this rank's share, see above) under the current
/// scope. No-op unless recording.
void record_traffic(const std::string& op, double bytes);
/// Adds `bytes` to the lower bound of (current scope, op). No-op unless recording.
void record_traffic_bound(const std::string& op, double bytes);
/// Everything counted since the last take, then cleared.
TrafficTable take_traffic();

class TrafficScope {
 public:
  explicit TrafficScope(std::string name);
  ~TrafficScope();
  TrafficScope(const TrafficScope&) = delete;
  TrafficScope& operator=(const TrafficScope&) = delete;
  /// The innermost scope on this thread ("other" outside any).
  static const std::string& current();

 private:
  std::string previous_;
};

}  // namespace hyperpar::comm
