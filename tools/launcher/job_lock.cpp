#include "job_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "launch_options.h"

namespace hyperpar::launcher {

int lock_log_dir(const std::string& log_dir) {
  const std::string path = log_dir + "/hyperpar-run.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw LaunchUsageError("--log_dir " + log_dir + ": cannot create the job lock " + path + ": " +
                           strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    std::ifstream(path) >> holder;
    close(fd);
    throw LaunchUsageError("--log_dir " + log_dir + " is in use by a running job (lock " + path +
                           " held by launcher pid " + (holder.empty() ? "?" : holder) +
                           "); give this job its own --log_dir");
  }
  note_lock_holder(fd);
  return fd;  // stays open (and locked) until the process exits
}

void note_lock_holder(int fd) {
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) == 0 && pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The pid is only informational; the lock itself is held.
  }
}

}  // namespace hyperpar::launcher
