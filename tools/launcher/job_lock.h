#pragma once
// One running job per log directory: an exclusive flock on LOG_DIR/hyperpar-run.lock,
// held for the job's life (the file says which launcher holds it). A second launcher given
// the same --log_dir fails at once instead of truncating the running job's logs. The lock
// goes away with the last process holding it, so a killed job never leaves a stale lock.
#include <string>

namespace hyperpar::launcher {

/// Takes the lock or throws LaunchUsageError naming the lock file and the holder's pid.
/// The descriptor is close-on-exec: workers do not inherit it. Returns it.
int lock_log_dir(const std::string& log_dir);
/// Writes the calling process's pid into the lock file (after a fork took the lock over).
void note_lock_holder(int lock_fd);

}  // namespace hyperpar::launcher
