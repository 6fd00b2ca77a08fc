#include "supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "failure_report.h"
#include "hyperpar/core/worker_record.h"
#include "worker_shim.h"

namespace hyperpar::launcher {
namespace {

using Clock = std::chrono::steady_clock;
// After a failure the launcher stops the other workers and SIGKILLs their shims after this
// long (their programs die with them): nothing is saved for a job that already failed.
constexpr auto kStopGrace = std::chrono::seconds(8);

std::chrono::milliseconds forwarded_grace(const LaunchOptions& o) {
  return std::chrono::milliseconds(static_cast<int64_t>((o.stop_grace_s + 5) * 1000));
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  // Orphaned descendants (e.g. shims of an mpirun that died) are reparented to us.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
}

bool alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

// Pids the shims recorded (LOG_DIR/worker_R.pid): under mpirun, the launcher's only way to
// reach its workers.
std::vector<pid_t> recorded_pids(const LaunchOptions& o, std::initializer_list<const char*> keys) {
  std::vector<pid_t> pids;
  for (int r = 0; r < o.worker_num; ++r) {
    const auto rec = record::read(record::path(o.log_dir, r, "pid"));
    for (const char* k : keys) {
      auto it = rec.find(k);
      if (it != rec.end()) pids.push_back(static_cast<pid_t>(std::stol(it->second)));
    }
  }
  return pids;
}

// Processes whose parent is this launcher (from /proc/<pid>/stat).
std::vector<pid_t> children_of_self() {
  std::vector<pid_t> out;
  const pid_t self = getpid();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == self) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Reaps every remaining descendant, SIGKILLing them after `deadline`; returns when none is
// left (ECHILD).
void reap_all(const std::vector<pid_t>& known, Clock::time_point deadline) {
  bool killed = false;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(-1, &status, WNOHANG);
    if (r < 0 && errno == ECHILD) return;
    if (r > 0) continue;
    if (!killed && Clock::now() > deadline) {
      for (pid_t p : known)
        if (alive(p)) kill(p, SIGKILL);
      killed = true;
      deadline = Clock::now() + std::chrono::seconds(2);
    } else if (killed && Clock::now() > deadline) {
      // Children we do not know by pid (grandchildren reparented to this subreaper).
      for (pid_t p : children_of_self()) kill(p, SIGKILL);
      deadline = Clock::now() + std::chrono::seconds(1);
    }
    usleep(20000);
  }
}

int finish(const LaunchOptions& o, int first_rank, int count, int fallback_code) {
  const auto rep = read_failure_report(o.log_dir, first_rank, count);
  const std::string text = rep.text(o.log_dir);
  if (g_signal) {
    std::cerr << "hyperpar-run: stopped by " << signal_name(g_signal) << "; every worker is gone\n";
    if (!text.empty()) std::cerr << text;
    return 128 + g_signal;
  }
  if (!text.empty()) std::cerr << text;
  if (rep.culprit) return rep.culprit->code ? rep.culprit->code : 1;
  // No failure, but workers that stopped on request (e.g. a preempted trainer, signalled
  // directly by a scheduler) ended non-zero: pass their status on.
  for (const auto& w : rep.workers)
    if (w.ending == Ending::kStopped && w.code != 0) return w.code;
  return fallback_code;
}

int attempt_local_workers(const LaunchOptions& o) {
  const int first = o.node_rank * o.local_worker_num;
  std::map<pid_t, int> rank_of;
  std::vector<pid_t> shims;
  for (int i = 0; i < o.local_worker_num; ++i) {
    const int rank = first + i;
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);  // a terminal's Ctrl-C reaches the launcher only; it forwards
      ShimSpec s;
      s.rank = rank;
      s.world_size = o.worker_num;
      s.local_rank = i;
      s.local_world_size = o.local_worker_num;
      s.node_rank = o.node_rank;
      s.log_dir = o.log_dir;
      s.command = o.command;
      s.echo_to_console = rank == 0;
      s.grace_s = o.stop_grace_s;
      _exit(run_worker_shim(s));
    }
    setpgid(pid, pid);
    rank_of[pid] = rank;
    shims.push_back(pid);
  }
  std::optional<Clock::time_point> kill_at;
  bool stopping = false;
  int forwarded = 0;
  size_t left = shims.size();
  while (left > 0) {
    if (g_signal && forwarded != g_signal) {
      forwarded = g_signal;
      for (pid_t p : shims) kill(p, g_signal);
      // The shims SIGKILL their programs after the grace; this is the backstop.
      kill_at = Clock::now() + forwarded_grace(o);
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) break;
    if (pid > 0) {
      if (!rank_of.count(pid)) continue;
      --left;
      const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      // After a forwarded stop signal the workers end on their own with it, most non-zero by
      // design: the first of them must not turn the user's signal into SIGTERM for the others
      // (a SIGINT trap still running elsewhere would be cut short).
      if (failed && !stopping && !forwarded) {
        // The first failure stops the job: every other worker is told to stop.
        stopping = true;
        for (pid_t p : shims)
          if (p != pid) kill(p, SIGTERM);
        if (!kill_at) kill_at = Clock::now() + kStopGrace;
      }
      continue;
    }
    if (kill_at && Clock::now() > *kill_at)
      for (pid_t p : shims) kill(p, SIGKILL);  // its program dies with it (PDEATHSIG)
    usleep(20000);
  }
  reap_all(shims, Clock::now() + std::chrono::seconds(2));
  return finish(o, first, o.local_worker_num, 0);
}

int attempt_mpirun(const LaunchOptions& o, const std::string& self_exe) {
  // --quiet: the launcher names the failing worker itself (failure_report.h).
  std::vector<std::string> args = {"mpirun",          "-np",       std::to_string(o.worker_num),
                                   "--oversubscribe", "--bind-to", "none",
                                   "--quiet"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const char* v : {"MASTER_ADDR", "MASTER_PORT", "HYPERPAR_BACKEND", "HYPERPAR_BACKEND_FLAG",
                        "OMP_NUM_THREADS", "HYPERPAR_CONSOLE_TTY", "HYPERPAR_STOP_GRACE_S"})
    if (getenv(v)) args.insert(args.end(), {"-x", v});
  args.insert(args.end(), {self_exe, "--worker-shim", o.log_dir, "--"});
  args.insert(args.end(), o.command.begin(), o.command.end());
  const pid_t launcher = getpid();
  const pid_t mpirun = fork();
  if (mpirun == 0) {
    setpgid(0, 0);
    // mpirun stops its job when it gets SIGTERM: also when the launcher is SIGKILLed.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) _exit(128 + SIGTERM);
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    execvp("mpirun", av.data());
    std::cerr << "hyperpar-run: cannot execute mpirun (is openmpi-bin installed?)\n";
    _exit(127);
  }
  setpgid(mpirun, mpirun);
  std::optional<Clock::time_point> kill_at;
  int forwarded = 0;
  int status = 0;
  while (true) {
    if (g_signal && forwarded != g_signal) {
      forwarded = g_signal;
      for (pid_t p : recorded_pids(o, {"shim"})) kill(p, g_signal);
      kill_at = Clock::now() + forwarded_grace(o);
    }
    const pid_t r = waitpid(mpirun, &status, WNOHANG);
    if (r == mpirun || (r < 0 && errno == ECHILD)) break;
    if (kill_at && Clock::now() > *kill_at) {
      kill(-mpirun, SIGKILL);
      for (pid_t p : recorded_pids(o, {"shim", "program"})) kill(p, SIGKILL);
    }
    usleep(20000);
  }
  // mpirun is gone; any shim or program it left behind is ours now (subreaper).
  const auto left = recorded_pids(o, {"shim", "program"});
  for (pid_t p : left)
    if (alive(p)) kill(p, SIGTERM);
  reap_all(left, Clock::now() + std::chrono::seconds(5));
  const int mpirun_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const int code = finish(o, 0, o.worker_num, mpirun_code);
  if (code == mpirun_code && code != 0 && !g_signal)
    std::cerr << "hyperpar-run: mpirun exited with code " << code << "; logs in " << o.log_dir
              << "\n";
  return code;
}

}  // namespace

int supervise_job(const LaunchOptions& o, const std::string& backend, const std::string& self_exe) {
  install_signal_handlers();
  const int first = o.node_rank * o.local_worker_num;
  for (int attempt = 0;; ++attempt) {
    setenv("HYPERPAR_RESTART_COUNT", std::to_string(attempt).c_str(), 1);
    for (int r = first; r < first + o.local_worker_num; ++r)
      for (const char* kind : {"exit", "error", "pid"})
        std::filesystem::remove(record::path(o.log_dir, r, kind));
    const int code = backend == "gloo" ? attempt_local_workers(o) : attempt_mpirun(o, self_exe);
    if (code == 0 || g_signal || attempt >= o.max_restarts) return code;
    std::cerr << "hyperpar-run: restarting the job (restart " << attempt + 1 << " of "
              << o.max_restarts << "); workers resume from their newest complete checkpoint\n";
  }
}

}  // namespace hyperpar::launcher
