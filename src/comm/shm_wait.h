#pragma once
// What the shared-memory mechanisms (shm_ring.h, host_window.h; internal to comm/) share:
// which host a process is on, and waits on a word in shared memory that sleep on a futex and
// notice a peer's exit or the collective timeout instead of hanging.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hyperpar::comm::shm {

/// Hostname and boot id: two processes may share memory only when both are equal.
std::string host_identity();

/// Until when a wait in shared memory may take: longer than the collective watchdog's timeout
/// (watchdog.h), so that the watchdog, which names the operation, reports first.
std::chrono::steady_clock::time_point wait_deadline();

/// Wakes every process waiting on `word` (a futex shared between processes).
void wake_all(uint32_t* word);

/// Returns once `done(value)` holds for the word's value (read with acquire): spins briefly,
/// then sleeps on the futex in 50 ms ticks. Throws PeerError when process `pid` (group rank
/// `peer`, who should change the word) is gone, and Error when the deadline passes; `what`
/// names the awaited event in both.
void wait_word(uint32_t* word, const std::function<bool(uint32_t)>& done, int64_t peer, int64_t pid,
               const char* what);
/// The same, where any of `peers` (group rank, pid) may be the one to change the word.
void wait_word(uint32_t* word, const std::function<bool(uint32_t)>& done,
               const std::vector<std::pair<int64_t, int64_t>>& peers, const char* what);

/// Round 1 of a set-up exchange (ShmRing::Exchange, HostWindow::Exchange: the same type):
/// every rank says whether its own set-up succeeded (`ok`). True only if every rank's did;
/// otherwise `reason` (when this rank's own set-up succeeded) names the first rank that
/// could not `what`, so every rank disables alike.
bool every_rank_succeeded(
    const std::function<std::vector<std::string>(const std::string&, int)>& exchange, bool ok,
    std::string& reason, const std::string& what);

/// Whether process `pid` no longer exists.
bool process_gone(int64_t pid);

}  // namespace hyperpar::comm::shm
