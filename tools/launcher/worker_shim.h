#pragma once
// The shim between the launcher (or mpirun) and one worker program. It
// - runs the program in its own process group with RANK, WORLD_SIZE, LOCAL_RANK,
//   LOCAL_WORLD_SIZE, GROUP_RANK and HYPERPAR_ERROR_RECORD set;
// - sends the program's output to LOG_DIR/worker_R.log; worker 0's also to the console
//   (line by line as it arrives; a progress line redrawn with "\r\x1b[K" stays on one
//   console line and becomes one log line per redraw);
// - dies with its parent: the shim gets SIGTERM when its parent dies (PR_SET_PDEATHSIG)
//   and the program gets SIGKILL when the shim dies, so a killed launcher (SIGKILL, OOM
//   killer, CI timeout) leaves nothing behind;
// - forwards SIGTERM/SIGINT/SIGHUP to the program's process group (with SIGCONT, so a
//   stopped program receives them), then SIGKILLs it after `grace_s` (time for a trainer
//   to save a preemption checkpoint; HYPERPAR_STOP_GRACE_S), or after 5 s when the shim's
//   parent died;
// - writes LOG_DIR/worker_R.pid at start and LOG_DIR/worker_R.exit at the end
//   (core/worker_record.h), and appends a last line to the log saying how the worker ended.
// Returns the program's exit code, or 128 + signal when a signal ended it.
#include <string>
#include <vector>

namespace hyperpar::launcher {

struct ShimSpec {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1, node_rank = 0;
  std::string log_dir;
  std::vector<std::string> command;
  bool echo_to_console = false;
  double grace_s = 30.0;
};

int run_worker_shim(const ShimSpec& spec);

/// "SIGKILL" for 9.
std::string signal_name(int sig);

}  // namespace hyperpar::launcher
