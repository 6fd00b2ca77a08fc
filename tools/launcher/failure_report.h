#pragma once
// Who failed first: the launcher's reading of the worker records (core/worker_record.h).
//
// A worker's ending is one of
//   ok          exited 0
//   primary     killed by a signal nobody sent it on purpose, or exited non-zero with an
//               error of its own (or with no error record: it could not say why)
//   consequence failed because another did: a peer closed the connection, a collective
//               timed out (kind=peer|timeout)
//   stopped     ended after it was told to stop (the launcher/mpirun stopping the job), or
//               its shim was killed while the job was stopped (pid record, no exit record)
//   missing     never started (no record at all)
// The culprit is the earliest primary failure; without one, the earliest consequence.
//
//   hyperpar-run: worker 5 killed by SIGKILL; see logs/worker_5.log
//   hyperpar-run: failed as a consequence: worker 2 (peer: gloo collective failed ...), ...
//   hyperpar-run: stopped by the launcher: workers 0, 1, 3, 4, 6, 7
#include <optional>
#include <string>
#include <vector>

namespace hyperpar::launcher {

enum class Ending { kOk, kPrimary, kConsequence, kStopped, kMissing };

struct WorkerEnding {
  int rank = 0;
  Ending ending = Ending::kMissing;
  int code = 0;             // exit code, or 128 + signal
  int64_t time_ns = 0;      // when it failed (error record) or ended (exit record)
  std::string description;  // "killed by SIGKILL", "exited with code 1: <message>"
};

struct FailureReport {
  std::vector<WorkerEnding> workers;
  std::optional<WorkerEnding> culprit;
  /// Lines for the launcher's stderr (empty when every worker exited 0).
  std::string text(const std::string& log_dir) const;
};

FailureReport read_failure_report(const std::string& log_dir, int first_rank, int count);

}  // namespace hyperpar::launcher
