#pragma once
// hyperpar-run's command line: msrun's flags, torchrun's spellings as aliases, one program.
//
//   hyperpar-run --worker_num=8 --local_worker_num=8 --master_port=8128 --log_dir=logs
//                --join=True build/tools/hyperpar-train --config configs/tp2_fsdp.yaml
//   (one command line)
//   hyperpar-run --nproc_per_node 4 --nnodes 2 --node_rank 1 --master_addr h0 -- prog args
//
// Rules (msrun/torchrun habits):
// - The first argument that is not a flag is the program; it and everything after it go to
//   the program untouched. `--` before the program is accepted too.
// - Flags take `--flag value` or `--flag=value`; `-` and `_` are interchangeable in names.
// - Boolean flags (--join, --standalone) take `--join`, `--join=VALUE` or `--join VALUE`
//   where VALUE is True/true/1/False/false/0; a following non-boolean word is the program.
// - torchrun's family: --nproc_per_node, --nnodes, --node_rank, --master_addr, --master_port,
//   --standalone. Total workers = nnodes x nproc_per_node. When both families give a count
//   and they disagree, parsing fails naming both.
// Every error is a LaunchUsageError naming the flag, the value and what is expected; the
// launcher prints it and exits 2.
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace hyperpar::launcher {

class LaunchUsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchOptions {
  int worker_num = 1;        // all workers of the job, every node
  int local_worker_num = 1;  // workers this launcher starts
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: pick a free port (--standalone)
  std::string log_dir = "hyperpar_logs";
  bool join = true;
  double stop_grace_s = 30;
  int max_restarts = 0;  // torchrun's: restart the whole job this many times after a failure  //
                         // after forwarding SIGTERM/SIGINT/SIGHUP: wait, then SIGKILL
  std::optional<std::string> backend;  // --backend, when given
  std::vector<std::string> command;    // program and its arguments
  bool help = false;
  std::string worker_shim;  // internal: run as the shim of one worker, logs in this dir
};

/// Parses argv[1..] (program name excluded). Throws LaunchUsageError.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

/// The --help text.
std::string launch_usage();

}  // namespace hyperpar::launcher
