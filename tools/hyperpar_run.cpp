// hyperpar-run: starts N workers of a program (msrun/torchrun-style flags) and fails fast.
//
//   hyperpar-run --worker_num 8 --log_dir logs -- ./prog args...
//
// Backend gloo: the launcher forks this node's workers itself (ranks node_rank *
// local_worker_num + i), each in its own process group with the same environment and logs;
// the first worker to exit non-zero gets the others stopped and is named.
// Backend mpi (the default): goes through `mpirun -np N` (as root where needed, with
// --oversubscribe for more workers than cores). Every worker runs through this program's
// worker shim, which sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/
// MASTER_PORT, writes the worker's output to LOG_DIR/worker_R.log (worker 0 is also
// echoed to the console) and records a failure marker. When a worker exits non-zero,
// mpirun stops the others; the launcher then exits non-zero naming the worker and its log.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

// mpirun's process group, stopped when the launcher itself is told to stop.
volatile pid_t g_mpirun_pgid = 0;
void forward_signal(int sig) {
  if (g_mpirun_pgid > 0) kill(-g_mpirun_pgid, sig);
  signal(sig, SIG_DFL);
  raise(sig);
}

// Runs one worker (RANK etc. already in the environment) with its output in its log, and
// records a failure marker when it exits non-zero. Returns the worker's exit code.
int run_worker(const std::string& log_dir, std::vector<std::string> cmd) {
  const std::string rank = std::getenv("RANK");
  const std::string log = log_dir + "/worker_" + rank + ".log";
  const std::string marker = log_dir + "/worker_" + rank + ".failed";
  setenv("HYPERPAR_FAIL_MARKER", marker.c_str(), 1);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      std::cerr << "hyperpar-run: cannot open log " << log << "\n";
      _exit(127);
    }
    if (rank == "0") {
      // Worker 0: console and log, through tee.
      int p[2];
      if (pipe(p) == 0 && fork() == 0) {
        close(p[1]);
        dup2(p[0], 0);
        execlp("tee", "tee", log.c_str(), (char*)nullptr);
        _exit(127);
      }
      close(p[0]);
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[1]);
    } else {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    close(fd);
    std::vector<char*> argv;
    for (auto& a : cmd) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::cerr << "hyperpar-run: cannot execute " << cmd[0] << "\n";
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0) {
    std::ofstream(marker) << code << "\n";
  }
  return code;
}

// mpirun's shim: takes the rank variables from Open MPI's environment.
int exec_worker(const std::string& log_dir, std::vector<std::string> cmd) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string rank = r ? r : "0";
  setenv("RANK", rank.c_str(), 1);
  setenv("WORLD_SIZE", s ? s : "1", 1);
  setenv("LOCAL_RANK", lr ? lr : rank.c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", ls ? ls : (s ? s : "1"), 1);
  return run_worker(log_dir, std::move(cmd));
}

// Names the first worker with a failure marker, if any (returns -1 when none).
int first_failed_worker(const std::string& log_dir, int first_rank, int n, int* code) {
  for (int r = first_rank; r < first_rank + n; ++r) {
    std::ifstream f(log_dir + "/worker_" + std::to_string(r) + ".failed");
    if (f >> *code) return r;
  }
  return -1;
}

// Process groups of the gloo-mode workers, stopped when the launcher is told to stop.
std::vector<pid_t> g_worker_pgids;
void forward_signal_to_workers(int sig) {
  for (pid_t p : g_worker_pgids) kill(-p, sig);
  signal(sig, SIG_DFL);
  raise(sig);
}

// gloo mode: this launcher forks the node's workers itself. The first worker to exit
// non-zero gets the others stopped (SIGTERM, then SIGKILL after 3 s).
int launch_local_workers(int worker_num, int local_worker_num, int node_rank,
                         const std::string& log_dir, const std::vector<std::string>& cmd,
                         bool join) {
  const int first = node_rank * local_worker_num;
  std::map<pid_t, int> rank_of;
  for (int i = 0; i < local_worker_num; ++i) {
    const int rank = first + i;
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(worker_num).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(local_worker_num).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      _exit(run_worker(log_dir, cmd));
    }
    setpgid(pid, pid);
    g_worker_pgids.push_back(pid);
    rank_of[pid] = rank;
  }
  signal(SIGTERM, forward_signal_to_workers);
  signal(SIGINT, forward_signal_to_workers);
  signal(SIGHUP, forward_signal_to_workers);
  if (!join) {
    std::cout << "hyperpar-run: started " << local_worker_num << " gloo workers, logs in "
              << log_dir << "\n";
    return 0;
  }
  int failed_rank = -1, failed_code = 0;
  size_t alive = rank_of.size();
  std::chrono::steady_clock::time_point kill_at{};
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0) break;
    if (pid == 0) {
      // Workers that ignore SIGTERM are killed after a grace period.
      if (failed_rank >= 0 && std::chrono::steady_clock::now() > kill_at)
        for (pid_t p : g_worker_pgids) kill(-p, SIGKILL);
      usleep(20000);
      continue;
    }
    if (!rank_of.count(pid)) continue;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && failed_rank < 0) {
      failed_rank = rank_of[pid];
      failed_code = code;
      for (pid_t p : g_worker_pgids) kill(-p, SIGTERM);
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    }
  }
  if (failed_rank >= 0) {
    std::cerr << "hyperpar-run: worker " << failed_rank << " exited with code " << failed_code
              << "; see " << log_dir << "/worker_" << failed_rank << ".log\n";
    return failed_code;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hyperpar-run: start N workers of a program"};
  int worker_num = 1, local_worker_num = -1, node_rank = 0, master_port = 29500;
  std::string master_addr = "127.0.0.1", log_dir = "hyperpar_logs", backend = "mpi";
  bool join = true;
  std::string worker_shim;
  std::vector<std::string> cmd;
  app.add_option("--worker_num", worker_num, "total number of workers")->check(CLI::PositiveNumber);
  app.add_option("--local_worker_num", local_worker_num, "workers on this node (default: all)");
  app.add_option("--master_addr", master_addr, "rendezvous host");
  app.add_option("--master_port", master_port, "rendezvous port");
  app.add_option("--node_rank", node_rank, "this node's index");
  app.add_option("--log_dir", log_dir, "one log file per worker goes here");
  app.add_flag("--join,!--no-join", join, "wait for the workers (default) or return at once");
  app.add_option("--backend", backend, "mpi (through mpirun) or gloo (c10d; workers forked here)")
      ->check(CLI::IsMember({"mpi", "gloo"}));
  app.add_option("--worker-shim", worker_shim, "internal: run as one worker")->group("");
  app.add_option("command", cmd, "program and its arguments (after --)")->required();
  CLI11_PARSE(app, argc, argv);

  if (!worker_shim.empty()) return exec_worker(worker_shim, cmd);

  if (local_worker_num < 0) local_worker_num = worker_num;
  if (local_worker_num <= 0 || worker_num % local_worker_num != 0 || node_rank < 0 ||
      node_rank >= worker_num / local_worker_num) {
    std::cerr << "hyperpar-run: --local_worker_num " << local_worker_num << " must divide "
              << "--worker_num " << worker_num << " and --node_rank " << node_rank
              << " must be below the node count\n";
    return 2;
  }
  if (backend == "mpi" && (local_worker_num != worker_num || node_rank != 0)) {
    std::cerr << "hyperpar-run: --backend mpi starts every worker through one mpirun; for "
                 "several nodes run mpirun with a hostfile directly (hyperpar programs start "
                 "under plain mpirun)\n";
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) {
    std::cerr << "hyperpar-run: cannot create --log_dir " << log_dir << ": " << ec.message()
              << "\n";
    return 2;
  }
  for (int r = 0; r < worker_num; ++r)
    unlink((log_dir + "/worker_" + std::to_string(r) + ".failed").c_str());
  setenv("MASTER_ADDR", master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
  setenv("HYPERPAR_BACKEND", backend.c_str(), 1);
  setenv("OMP_NUM_THREADS", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "1",
         1);
  if (backend == "gloo")
    return launch_local_workers(worker_num, local_worker_num, node_rank, log_dir, cmd, join);

  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::cerr << "hyperpar-run: cannot resolve its own path\n";
    return 2;
  }
  self[n] = 0;
  std::vector<std::string> args = {"mpirun",          "-np",       std::to_string(worker_num),
                                   "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const char* v : {"MASTER_ADDR", "MASTER_PORT", "HYPERPAR_BACKEND", "OMP_NUM_THREADS"}) {
    args.push_back("-x");
    args.push_back(v);
  }
  args.insert(args.end(), {self, "--worker-shim", log_dir, "--"});
  args.insert(args.end(), cmd.begin(), cmd.end());

  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    execvp("mpirun", av.data());
    std::cerr << "hyperpar-run: cannot execute mpirun (is openmpi-bin installed?)\n";
    _exit(127);
  }
  setpgid(pid, pid);
  g_mpirun_pgid = pid;
  signal(SIGTERM, forward_signal);
  signal(SIGINT, forward_signal);
  signal(SIGHUP, forward_signal);
  if (!join) {
    std::cout << "hyperpar-run: started " << worker_num << " workers (mpirun pid " << pid
              << "), logs in " << log_dir << "\n";
    return 0;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  int worker_code = 0;
  const int failed = first_failed_worker(log_dir, 0, worker_num, &worker_code);
  if (failed >= 0) {
    std::cerr << "hyperpar-run: worker " << failed << " exited with code " << worker_code
              << "; see " << log_dir << "/worker_" << failed << ".log\n";
    return code ? code : 1;
  }
  if (code != 0)
    std::cerr << "hyperpar-run: mpirun exited with code " << code << "; logs in " << log_dir
              << "\n";
  return code;
}
