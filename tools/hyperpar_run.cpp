// hyperpar-run: starts N workers of a program (msrun/torchrun-style flags) and fails fast.
//
//   hyperpar-run --worker_num 8 --log_dir logs -- ./prog args...
//
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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
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
  app.add_option("--backend", backend, "mpi (gloo: not built yet)")
      ->check(CLI::IsMember({"mpi", "gloo"}));
  app.add_option("--worker-shim", worker_shim, "internal: run as one worker")->group("");
  app.add_option("command", cmd, "program and its arguments (after --)")->required();
  CLI11_PARSE(app, argc, argv);

  if (!worker_shim.empty()) return exec_worker(worker_shim, cmd);

  if (local_worker_num < 0) local_worker_num = worker_num;
  if (backend != "mpi") {
    std::cerr << "hyperpar-run: backend '" << backend
              << "' is not available in this build; use --backend mpi\n";
    return 2;
  }
  if (local_worker_num != worker_num || node_rank != 0) {
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
  const std::string port = std::to_string(master_port);
  setenv("MASTER_ADDR", master_addr.c_str(), 1);
  setenv("MASTER_PORT", port.c_str(), 1);
  setenv("HYPERPAR_BACKEND", "mpi", 1);
  setenv("OMP_NUM_THREADS", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "1",
         1);
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
  for (int r = 0; r < worker_num; ++r) {
    std::ifstream f(log_dir + "/worker_" + std::to_string(r) + ".failed");
    int wc = 0;
    if (f >> wc) {
      std::cerr << "hyperpar-run: worker " << r << " exited with code " << wc << "; see " << log_dir
                << "/worker_" << r << ".log\n";
      return code ? code : 1;
    }
  }
  if (code != 0)
    std::cerr << "hyperpar-run: mpirun exited with code " << code << "; logs in " << log_dir
              << "\n";
  return code;
}
