#include "shm_wait.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <fstream>

#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/error.h"

namespace hyperpar::comm::shm {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

long futex(uint32_t* word, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, word, op, val, timeout, nullptr, 0);
}

}  // namespace

std::string host_identity() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(name) + "/" + boot;
}

std::chrono::steady_clock::time_point wait_deadline() {
  return std::chrono::steady_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>((collective_timeout_s() + 60) * 1000));
}

void wake_all(uint32_t* word) { futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

bool every_rank_succeeded(
    const std::function<std::vector<std::string>(const std::string&, int)>& exchange, bool ok,
    std::string& reason, const std::string& what) {
  const auto oks = exchange(ok ? "1" : "0", 1);
  for (size_t r = 0; r < oks.size() && ok; ++r)
    if (oks[r] != "1") {
      ok = false;
      reason = "rank " + std::to_string(r) + " could not " + what;
    }
  return ok;
}

bool process_gone(int64_t pid) { return kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

void wait_word(uint32_t* word, const std::function<bool(uint32_t)>& done, int64_t peer, int64_t pid,
               const char* what) {
  wait_word(word, done, std::vector<std::pair<int64_t, int64_t>>{{peer, pid}}, what);
}

void wait_word(uint32_t* word, const std::function<bool(uint32_t)>& done,
               const std::vector<std::pair<int64_t, int64_t>>& peers, const char* what) {
  for (int i = 0; i < 64; ++i) {
    if (done(__atomic_load_n(word, __ATOMIC_ACQUIRE))) return;
    cpu_relax();
  }
  const auto deadline = wait_deadline();
  const timespec tick{0, 50 * 1000 * 1000};
  while (true) {
    const uint32_t now = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (done(now)) return;
    if (futex(word, FUTEX_WAIT, now, &tick) == 0 || errno != ETIMEDOUT) continue;
    for (const auto& [peer, pid] : peers)
      if (process_gone(pid))
        throw PeerError(detail::concat("shared-memory collective: rank ", peer, " (pid ", pid,
                                       ") exited while this rank waited for its ", what));
    HP_CHECK(std::chrono::steady_clock::now() < deadline, "shared-memory collective: ",
             peers.size() == 1 ? "rank " + std::to_string(peers[0].first) : std::string("a peer"),
             " did not publish its ", what, " within the collective timeout");
  }
}

}  // namespace hyperpar::comm::shm
