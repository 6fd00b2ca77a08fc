#include "hyperpar/train/profile_trace.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "hyperpar/comm/gather_strings.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/profiler.h"

namespace hyperpar::train {

namespace {

// Seconds covered by at least one of the [begin, end) intervals (microseconds).
double covered_s(std::vector<std::pair<int64_t, int64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, end = std::numeric_limits<int64_t>::min();
  for (const auto& [b, e] : spans) {
    const int64_t from = std::max(b, end);
    if (e > from) total += e - from;
    end = std::max(end, e);
  }
  return static_cast<double>(total) * 1e-6;
}

// Per rank: steps, and the time covered by each kind of span. Asynchronous collectives
// overlap each other, so "in flight" is the time at least one was, not their sum.
struct Overlap {
  int64_t steps = 0;
  double in_flight_s = 0, waited_s = 0, blocking_s = 0, step_s = 0;
};

Overlap overlap_of(const nlohmann::json& events) {
  Overlap o;
  std::vector<std::pair<int64_t, int64_t>> in_flight, waits, blocking;
  for (const auto& e : events) {
    const int64_t b = e["ts"].get<int64_t>(), end = b + e["dur"].get<int64_t>();
    const std::string name = e["name"], cat = e["cat"];
    if (e["tid"] == profile::kComm) {
      in_flight.push_back({b, end});
    } else if (cat == "comm") {
      (name.rfind("wait ", 0) == 0 ? waits : blocking).push_back({b, end});
    } else if (cat == "step") {
      ++o.steps;
      o.step_s += static_cast<double>(end - b) * 1e-6;
    }
  }
  o.in_flight_s = covered_s(in_flight);
  o.waited_s = covered_s(waits);
  o.blocking_s = covered_s(blocking);
  return o;
}

}  // namespace

std::string write_profile_trace(const std::string& path, comm::Communicator& world) {
  const int64_t rank = world.ranks()[world.rank()];
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& e : profile::take_events()) {
    nlohmann::json ev = {{"name", e.name},
                         {"cat", e.category},
                         {"ph", "X"},
                         {"ts", e.begin_us},
                         {"dur", e.end_us - e.begin_us},
                         {"pid", rank},
                         {"tid", e.track}};
    if (!e.detail.empty()) ev["args"] = {{"detail", e.detail}};
    mine.push_back(std::move(ev));
  }
  const auto all = comm::gather_strings(world, mine.dump());
  if (world.rank() != 0) return "";
  std::vector<nlohmann::json> per_rank;
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& s : all) {
    per_rank.push_back(nlohmann::json::parse(s));
    for (const auto& e : per_rank.back()) origin = std::min(origin, e["ts"].get<int64_t>());
  }
  nlohmann::json trace = {{"displayTimeUnit", "ms"}, {"traceEvents", nlohmann::json::array()}};
  auto& out = trace["traceEvents"];
  std::string summary;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const int64_t pid = world.ranks()[r];
    out.push_back({{"name", "process_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"args", {{"name", "rank " + std::to_string(pid)}}}});
    out.push_back({{"name", "process_sort_index"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"args", {{"sort_index", pid}}}});
    out.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"tid", profile::kMain},
                   {"args", {{"name", "compute"}}}});
    out.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"tid", profile::kComm},
                   {"args", {{"name", "collectives in flight"}}}});
    const Overlap o = overlap_of(per_rank[r]);
    for (auto& e : per_rank[r]) {
      e["ts"] = e["ts"].get<int64_t>() - origin;
      out.push_back(std::move(e));
    }
    const double n = std::max<double>(1, static_cast<double>(o.steps));
    char line[320];
    std::snprintf(line, sizeof(line),
                  "rank %lld: step %.1f ms; blocking collectives %.1f ms; asynchronous "
                  "collectives in flight %.1f ms, of which waited for %.1f ms (%.0f%% overlapped "
                  "with compute or other collectives)\n",
                  static_cast<long long>(pid), 1e3 * o.step_s / n, 1e3 * o.blocking_s / n,
                  1e3 * o.in_flight_s / n, 1e3 * o.waited_s / n,
                  o.in_flight_s > 0 ? 100.0 * (1.0 - o.waited_s / o.in_flight_s) : 0.0);
    summary += line;
  }
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream f(path, std::ios::trunc);
  HP_CHECK(f.is_open(), "--profile ", path, ": cannot open for writing");
  f << trace.dump();
  f.close();
  HP_CHECK(f.good(), "--profile ", path, ": writing the trace failed (disk full?)");
  return summary;
}

}  // namespace hyperpar::train
