#pragma once
// Supervising a job: start this node's workers (each through the worker shim), wait for
// them, stop them all at the first failure, forward SIGINT/SIGTERM/SIGHUP, and report who
// failed first (failure_report.h). The launcher is a child subreaper, so workers orphaned
// by a dying mpirun come back to it and are never left running.
//
//   gloo: the launcher forks one shim per local worker (ranks node_rank*local + i).
//   mpi:  the launcher runs `mpirun -np N ... hyperpar-run --worker-shim LOG_DIR -- prog`;
//         mpirun starts the shims; the launcher reaches them through LOG_DIR/worker_R.pid.
// Returns the exit code of the launcher: 0; the culprit's code; or 128 + signal when the
// launcher was told to stop (only once no worker is left).
#include <string>

#include "launch_options.h"

namespace hyperpar::launcher {

/// Runs the job (backend "gloo" or "mpi") and, after a failure, restarts it up to
/// o.max_restarts times (each attempt a fresh rendezvous; HYPERPAR_RESTART_COUNT tells the
/// workers, whose logs are appended to; a trainer resumes from its newest checkpoint).
int supervise_job(const LaunchOptions& o, const std::string& backend, const std::string& self_exe);

}  // namespace hyperpar::launcher
