#include "failure_report.h"

#include <signal.h>

#include <algorithm>
#include <sstream>

#include "hyperpar/core/worker_record.h"
#include "worker_shim.h"

namespace hyperpar::launcher {
namespace {

int64_t to_i64(const record::Record& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end()) return 0;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    return 0;
  }
}

std::string get(const record::Record& r, const char* key) {
  auto it = r.find(key);
  return it == r.end() ? std::string() : it->second;
}

WorkerEnding classify(const std::string& log_dir, int rank) {
  WorkerEnding w;
  w.rank = rank;
  const auto ex = record::read(record::path(log_dir, rank, "exit"));
  const auto err = record::read(record::path(log_dir, rank, "error"));
  if (ex.empty()) {
    // mpirun SIGKILLs the shims it stops when they do not exit at once: a worker that
    // started (pid record) but has no exit record was stopped that way.
    const bool started = !record::read(record::path(log_dir, rank, "pid")).empty();
    w.ending = started ? Ending::kStopped : Ending::kMissing;
    w.description = started ? "stopped (its shim was killed)" : "never started";
    return w;
  }
  w.code = static_cast<int>(to_i64(ex, "code"));
  const int sig = static_cast<int>(to_i64(ex, "signal"));
  const bool stopped = get(ex, "stopped") == "1";
  const int64_t stop_time = to_i64(ex, "stop_time_ns");
  w.time_ns = to_i64(ex, "time_ns");
  if (get(ex, "how") == "exit" && w.code == 0) {
    w.ending = Ending::kOk;
    w.description = "exited with code 0";
    return w;
  }
  w.description = get(ex, "how") == "signal" ? "killed by " + signal_name(sig)
                                             : "exited with code " + std::to_string(w.code);
  const std::string kind = get(err, "kind");
  const int64_t err_time = to_i64(err, "time_ns");
  if (!err.empty()) {
    w.description += ": " + get(err, "message");
    w.time_ns = err_time;
  }
  // A SIGKILL that neither the stop request nor this shim's escalation sent came from outside
  // (kill -9, the OOM killer): the worker's own failure even when its shim only reaped it
  // after the stop request, as happens under load when a peer reports the broken connection
  // first.
  const bool killed_from_outside = get(ex, "how") == "signal" && sig == SIGKILL &&
                                   to_i64(ex, "stop_signal") != SIGKILL &&
                                   get(ex, "escalated") != "1";
  // An error reported before the worker was told to stop is its own; after, collateral.
  const bool failed_before_stop =
      killed_from_outside || (!err.empty() && (!stopped || err_time < stop_time));
  if (kind == "stopped") {
    w.ending = Ending::kStopped;  // stopped on request (preempted after saving)
  } else if (stopped && !failed_before_stop) {
    w.ending = Ending::kStopped;
    w.time_ns = stop_time;
  } else if (kind == "peer" || kind == "timeout") {
    w.ending = Ending::kConsequence;
  } else {
    w.ending = Ending::kPrimary;
  }
  return w;
}

}  // namespace

FailureReport read_failure_report(const std::string& log_dir, int first_rank, int count) {
  FailureReport rep;
  for (int r = first_rank; r < first_rank + count; ++r) rep.workers.push_back(classify(log_dir, r));
  for (Ending e : {Ending::kPrimary, Ending::kConsequence}) {
    for (const auto& w : rep.workers)
      if (w.ending == e && (!rep.culprit || w.time_ns < rep.culprit->time_ns)) rep.culprit = w;
    if (rep.culprit) break;
  }
  return rep;
}

namespace {
std::string shorten(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n) + " ...";
}
}  // namespace

std::string FailureReport::text(const std::string& log_dir) const {
  std::ostringstream os;
  auto list = [&](Ending e, const char* what, bool with_reason) {
    std::vector<const WorkerEnding*> ws;
    for (const auto& w : workers)
      if (w.ending == e && (!culprit || w.rank != culprit->rank)) ws.push_back(&w);
    if (ws.empty()) return;
    os << "hyperpar-run: " << what << ": ";
    for (size_t i = 0; i < ws.size(); ++i) {
      os << (i ? ", " : "") << "worker " << ws[i]->rank;
      if (with_reason) os << " (" << shorten(ws[i]->description, 100) << ")";
    }
    os << "\n";
  };
  if (culprit) {
    os << "hyperpar-run: worker " << culprit->rank << " " << shorten(culprit->description, 300)
       << (culprit->ending == Ending::kConsequence
               ? " (no worker failed on its own; this is the first that reported)"
               : "")
       << "; see " << log_dir << "/worker_" << culprit->rank << ".log\n";
  }
  list(Ending::kPrimary, "also failed", true);
  list(Ending::kConsequence, "failed as a consequence", true);
  list(Ending::kStopped, "stopped by the launcher", false);
  list(Ending::kMissing, "no exit record", false);
  return os.str();
}

}  // namespace hyperpar::launcher
