// hyperpar-run: starts the workers of a job (msrun/torchrun-style flags), supervises them and
// names the one that failed first.
//
//   hyperpar-run --worker_num=8 --log_dir=logs --join=True build/tools/hyperpar-train --config
//   c.yaml hyperpar-run --nproc_per_node 8 --backend gloo -- build/tools/hyperpar-demo
//
// Flags: launcher/launch_options.h. Backend: --backend, else the program's comm.backend
// (its --config), else mpi; a conflict exits 2 (comm/backend_choice.h). Supervision,
// signals and the failure report: launcher/supervisor.h. Each worker runs through the worker
// shim (launcher/worker_shim.h): logs in LOG_DIR/worker_R.log, worker 0 echoed to the
// console, nothing left behind when the launcher dies. One job per --log_dir (job_lock.h).
// Every flag error exits 2.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "hyperpar/comm/backend_choice.h"
#include "launcher/config_backend.h"
#include "launcher/job_lock.h"
#include "launcher/launch_options.h"
#include "launcher/supervisor.h"
#include "launcher/worker_shim.h"

using namespace hyperpar::launcher;

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Under mpirun: one worker, its rank from Open MPI's environment.
int run_as_mpirun_shim(const LaunchOptions& o) {
  ShimSpec s;
  s.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
  s.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
  s.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", s.rank);
  s.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", s.world_size);
  s.node_rank = env_int("OMPI_COMM_WORLD_NODE_RANK", 0) / std::max(1, s.local_world_size);
  s.log_dir = o.worker_shim;
  s.command = o.command;
  s.echo_to_console = s.rank == 0;
  if (const char* g = std::getenv("HYPERPAR_STOP_GRACE_S")) s.grace_s = std::atof(g);
  return run_worker_shim(s);
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 29500;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions o;
  std::string backend;
  try {
    o = parse_launch_args(std::vector<std::string>(argv + 1, argv + argc));
    if (o.help) {
      std::cout << launch_usage();
      return 0;
    }
    if (!o.worker_shim.empty()) return run_as_mpirun_shim(o);
    hyperpar::comm::BackendRequest req;
    req.flag = o.backend;
    if (auto cb = config_backend(o.command)) {
      req.config = cb->backend;
      req.config_source = cb->source;
    }
    try {
      backend = hyperpar::comm::choose_backend(req);
    } catch (const hyperpar::comm::BackendConflict& e) {
      throw LaunchUsageError(e.what());
    }
    if (backend != "mpi" && backend != "gloo")
      throw LaunchUsageError("backend '" + backend + "' (from " + req.config_source +
                             ") is not supported; expected mpi or gloo");
    if (backend == "mpi" && o.local_worker_num != o.worker_num)
      throw LaunchUsageError(
          "--backend mpi starts every worker through one mpirun on this node; for several "
          "nodes use --backend gloo, or mpirun with a hostfile (hyperpar programs start under "
          "plain mpirun)");
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec)
      throw LaunchUsageError("--log_dir " + o.log_dir + " cannot be created: " + ec.message());
  } catch (const LaunchUsageError& e) {
    std::cerr << "hyperpar-run: " << e.what() << "\n";
    return 2;
  }
  int lock_fd = -1;
  try {
    lock_fd = lock_log_dir(o.log_dir);
  } catch (const LaunchUsageError& e) {
    std::cerr << "hyperpar-run: " << e.what() << "\n";
    return 2;
  }
  if (o.master_port == 0) o.master_port = free_port();
  setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  setenv("HYPERPAR_BACKEND", backend.c_str(), 1);
  if (o.backend)
    setenv("HYPERPAR_BACKEND_FLAG", o.backend->c_str(), 1);
  else
    unsetenv("HYPERPAR_BACKEND_FLAG");
  if (!std::getenv("OMP_NUM_THREADS")) setenv("OMP_NUM_THREADS", "1", 1);
  setenv("HYPERPAR_STOP_GRACE_S", std::to_string(o.stop_grace_s).c_str(), 1);
  if (isatty(STDOUT_FILENO) && o.join)
    setenv("HYPERPAR_CONSOLE_TTY", "1", 1);
  else
    unsetenv("HYPERPAR_CONSOLE_TTY");

  if (!o.join) {
    // --join False: a detached supervisor runs the job; this process returns at once.
    const pid_t pid = fork();
    if (pid > 0) {
      std::cout << "hyperpar-run: started " << o.local_worker_num << " " << backend
                << " workers under supervisor pid " << pid << "; logs in " << o.log_dir
                << " (launcher output in " << o.log_dir << "/launcher.log)\n";
      return 0;
    }
    setsid();
    note_lock_holder(lock_fd);
    const std::string out = o.log_dir + "/launcher.log";
    if (!freopen(out.c_str(), "w", stdout) || !freopen(out.c_str(), "a", stderr)) return 1;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::cerr << "hyperpar-run: cannot resolve its own path\n";
    return 2;
  }
  self[n] = 0;
  return supervise_job(o, backend, self);
}
