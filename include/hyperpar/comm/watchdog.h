#pragma once
// Collective watchdog (every backend, MPI included). Each collective a Communicator issues
// is registered from the moment it is enqueued until its Work completes; a helper thread
// checks twice a second, and a collective older than the current timeout ends the process
// with an error naming the op, the group (label and ranks), the caller's tag and the
// seconds waited (recorded as kind "timeout" for the launcher, exit code 1). The peers of a
// stopped, hung or dead rank are thus detected even inside blocking MPI calls, which no
// exception can leave.
//
// Two timeouts, as torchtitan has them: the trainer sets comm.init_timeout_s (default 300:
// rendezvous, communicator creation, materialisation and the first step) before it starts,
// then comm.train_timeout_s (default 100) once the first step is done:
//
//   comm::set_collective_timeout(cfg.comm.init_timeout_s, "comm.init_timeout_s");
//   ... first step ...
//   comm::set_collective_timeout(cfg.comm.train_timeout_s, "comm.train_timeout_s");
//
// Programs that never set one use the init default (300 s).
#include <cstdint>
#include <string>

namespace hyperpar::comm {

constexpr double kDefaultInitTimeoutS = 300;
constexpr double kDefaultTrainTimeoutS = 100;

/// Sets the timeout for collectives from now on (and those in flight); `setting` names
/// where it came from, for the message.
void set_collective_timeout(double seconds, const std::string& setting);
double collective_timeout_s();

/// Registers a collective (what = "all_reduce on mesh dim tp ranks [4, 5] (mpi), tag 'x'");
/// returns its id for watch_end.
uint64_t watch_begin(std::string what);
void watch_end(uint64_t id);

/// RAII registration of a blocking call (communicator creation, a synchronous collective);
/// release() hands the registration to whoever ends it later (an asynchronous Work).
class WatchScope {
 public:
  explicit WatchScope(std::string what) : id_(watch_begin(std::move(what))) {}
  explicit WatchScope(uint64_t id) : id_(id) {}
  ~WatchScope() {
    if (id_) watch_end(id_);
  }
  uint64_t release() {
    const uint64_t id = id_;
    id_ = 0;
    return id;
  }
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  uint64_t id_;
};

}  // namespace hyperpar::comm
