#include "worker_shim.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "hyperpar/core/worker_record.h"

namespace hyperpar::launcher {
namespace {

constexpr double kOrphanGraceS = 5.0;
volatile sig_atomic_t g_stop_signal = 0;
volatile pid_t g_program_pgid = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;
  const pid_t pg = g_program_pgid;
  if (pg > 0) {
    kill(-pg, sig);
    kill(-pg, SIGCONT);  // a stopped program only acts on the signal once continued
  }
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Copies worker 0's output to the console as is, and to the log with progress redraws
// ("\r" + "\x1b[K") turned into one line each.
class ConsoleAndLog {
 public:
  explicit ConsoleAndLog(int log_fd) : log_(log_fd) {}
  void put(const char* data, size_t n) {
    write_all(STDOUT_FILENO, data, n);
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      const char c = data[i];
      if (esc_ == 1) {
        esc_ = c == '[' ? 2 : 0;
        if (esc_ == 0) out += "\x1b" + std::string(1, c);
        continue;
      }
      if (esc_ == 2) {
        esc_ = 0;
        if (c == 'K') continue;  // erase-line: meaningless in a file
        out += "\x1b[" + std::string(1, c);
        continue;
      }
      if (c == '\x1b') {
        esc_ = 1;
        continue;
      }
      if (c == '\r') {
        if (!line_start_) out += '\n';
        line_start_ = true;
        continue;
      }
      out += c;
      line_start_ = c == '\n';
    }
    write_all(log_, out.data(), out.size());
  }
  void finish() {
    if (!line_start_) write_all(log_, "\n", 1);
    line_start_ = true;
  }

 private:
  int log_;
  int esc_ = 0;
  bool line_start_ = true;
};

}  // namespace

std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#endif
  return "signal " + std::to_string(sig);
}

int run_worker_shim(const ShimSpec& s) {
  // Die with the parent (launcher or mpirun): SIGTERM, forwarded to the program below.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  const pid_t parent = getppid();
  if (parent == 1) g_stop_signal = SIGTERM;  // the parent is already gone

  const std::string rank = std::to_string(s.rank);
  setenv("RANK", rank.c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(s.world_size).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(s.local_rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(s.local_world_size).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(s.node_rank).c_str(), 1);
  const std::string error_record = record::path(s.log_dir, s.rank, "error");
  const std::string exit_record = record::path(s.log_dir, s.rank, "exit");
  unlink(error_record.c_str());
  unlink(exit_record.c_str());
  setenv("HYPERPAR_ERROR_RECORD", error_record.c_str(), 1);
  if (!s.echo_to_console) unsetenv("HYPERPAR_CONSOLE_TTY");

  const std::string log = s.log_dir + "/worker_" + rank + ".log";
  // A restarted job appends: the failed attempt's log stays readable above.
  const char* restart = std::getenv("HYPERPAR_RESTART_COUNT");
  const bool appending = restart && std::atoi(restart) > 0;
  const int log_fd =
      open(log.c_str(), O_WRONLY | O_CREAT | (appending ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    const std::string msg = "hyperpar-run: cannot open log " + log + ": " + strerror(errno) + "\n";
    write_all(STDERR_FILENO, msg.data(), msg.size());
    return 127;
  }
  if (appending) {
    const std::string banner = "hyperpar-run: ---- restart " + std::string(restart) + " ----\n";
    write_all(log_fd, banner.data(), banner.size());
  }
  int out_pipe[2] = {-1, -1};
  if (s.echo_to_console && pipe2(out_pipe, O_CLOEXEC) != 0) {
    write_all(STDERR_FILENO, "hyperpar-run: pipe failed\n", 26);
    return 127;
  }

  // Signals stay blocked across fork so that the handler always knows the program's group.
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&block, sig);
  sigprocmask(SIG_BLOCK, &block, &old);
  const pid_t shim_pid = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the shim died: nobody would ever stop this worker
    if (getppid() != shim_pid) _exit(128 + SIGKILL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    const int out = s.echo_to_console ? out_pipe[1] : log_fd;
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : s.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    const std::string msg =
        "hyperpar-run: cannot execute " + s.command[0] + ": " + strerror(errno) + "\n";
    write_all(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &old, nullptr);
    write_all(STDERR_FILENO, "hyperpar-run: fork failed\n", 26);
    return 127;
  }
  setpgid(pid, pid);
  g_program_pgid = pid;
  record::write(record::path(s.log_dir, s.rank, "pid"),
                {{"shim", std::to_string(shim_pid)}, {"program", std::to_string(pid)}});
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (g_stop_signal) on_stop_signal(g_stop_signal);

  std::optional<ConsoleAndLog> tee;
  int read_fd = -1;
  if (s.echo_to_console) {
    close(out_pipe[1]);
    read_fd = out_pipe[0];
    tee.emplace(log_fd);
  }
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> kill_at, drain_until;
  bool reaped = false;
  int status = 0;
  int64_t stop_time = 0;
  bool escalated = false;  // this shim sent the program SIGKILL after the grace period
  char buf[65536];
  while (!reaped || read_fd >= 0) {
    if (g_stop_signal && !kill_at) {
      // A forwarded stop may let the program save a checkpoint (grace_s); when the parent
      // died (PDEATHSIG), nobody waits: stop within kOrphanGraceS.
      const bool orphaned = getppid() != parent;
      const double grace = orphaned ? std::min(s.grace_s, kOrphanGraceS) : s.grace_s;
      kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace * 1000));
      stop_time = record::now_ns();
    }
    if (!reaped && kill_at && Clock::now() > *kill_at) {
      kill(-pid, SIGKILL);
      escalated = true;
    }
    if (read_fd >= 0) {
      pollfd p{read_fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        const ssize_t n = read(read_fd, buf, sizeof(buf));
        if (n > 0) {
          tee->put(buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          close(read_fd);
          read_fd = -1;
        }
      }
      // A grandchild may keep the pipe open after the program ended: drain for 1 s at most.
      if (reaped && read_fd >= 0 && !drain_until)
        drain_until = Clock::now() + std::chrono::seconds(1);
      if (drain_until && Clock::now() > *drain_until && read_fd >= 0) {
        close(read_fd);
        read_fd = -1;
      }
    } else {
      usleep(20000);
    }
    if (!reaped) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) reaped = true;
      if (r < 0 && errno != EINTR) {
        reaped = true;
        status = 0;
      }
    }
  }
  if (tee) tee->finish();
  kill(-pid, SIGKILL);  // anything the program left in its group
  const bool by_signal = WIFSIGNALED(status);
  const int sig = by_signal ? WTERMSIG(status) : 0;
  const int code = by_signal ? 128 + sig : WEXITSTATUS(status);
  const bool stopped = g_stop_signal != 0;
  record::write(exit_record, {{"how", by_signal ? "signal" : "exit"},
                              {"code", std::to_string(code)},
                              {"signal", std::to_string(sig)},
                              {"stopped", stopped ? "1" : "0"},
                              {"stop_signal", std::to_string(g_stop_signal)},
                              {"stop_time_ns", std::to_string(stop_time)},
                              {"escalated", escalated ? "1" : "0"},
                              {"time_ns", std::to_string(record::now_ns())}});
  std::string last =
      "hyperpar-run: worker " + rank +
      (by_signal ? " killed by " + signal_name(sig) : " exited with code " + std::to_string(code));
  if (stopped) last += " (told to stop with " + signal_name(g_stop_signal) + ")";
  last += "\n";
  write_all(log_fd, last.data(), last.size());
  close(log_fd);
  return code;
}

}  // namespace hyperpar::launcher
