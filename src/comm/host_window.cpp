#include "hyperpar/comm/host_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "hyperpar/core/error.h"
#include "shm_wait.h"

namespace hyperpar::comm {
namespace {

constexpr size_t kPage = 4096;
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
// Epochs wrap around after 2^32 uses; within half of that, later is later.
bool reached(uint32_t value, uint32_t epoch) { return static_cast<int32_t>(value - epoch) >= 0; }

}  // namespace

// Each on its own cache lines: `published` is written by its rank at every use and read by
// all, `released` likewise; keeping them apart keeps readers of one off the other's line.
struct HostWindow::RankWords {
  alignas(64) uint32_t published;
  alignas(64) uint32_t released;
};

HostWindow::RankWords* HostWindow::words(int64_t r) const {
  return reinterpret_cast<RankWords*>(map_) + r;
}

HostWindow::HostWindow(const Exchange& exchange, int64_t size, int64_t rank, size_t bytes)
    : size_(size), rank_(rank), bytes_(bytes) {
  const size_t header = round_up(static_cast<size_t>(size_) * sizeof(RankWords), kPage);
  mapped_ = header + round_up(std::max<size_t>(bytes_, 1), kPage);
  if (rank_ == 0) {
    fd_ = static_cast<int>(memfd_create("hyperpar-host-window", MFD_CLOEXEC));
    if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(mapped_)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  std::ostringstream me;
  me << shm::host_identity() << "\n" << getpid() << "\n" << fd_ << "\n" << bytes_;
  const auto all = exchange(me.str(), 0);
  bool ok = true;
  pids_.assign(static_cast<size_t>(size_), 0);
  int64_t owner_pid = 0, owner_fd = -1;
  for (int64_t r = 0; r < size_; ++r) {
    std::istringstream in(all[static_cast<size_t>(r)]);
    std::string host;
    int64_t pid = 0, fd = -1;
    size_t their_bytes = 0;
    std::getline(in, host);
    in >> pid >> fd >> their_bytes;
    pids_[static_cast<size_t>(r)] = pid;
    if (r == 0) {
      owner_pid = pid;
      owner_fd = fd;
    }
    // Every rank must ask for the same window: a mismatch is a caller's bug (calls out of
    // order between ranks), reported on every rank (each sees every request) rather than mapped.
    if (their_bytes != bytes_) {
      if (fd_ >= 0) close(fd_);
      throw Error(detail::concat("host window: rank ", r, " asked for ", their_bytes,
                                 " bytes where rank ", rank_, " asked for ", bytes_,
                                 " (windows must be created in the same order on every rank)"));
    }
    if (ok && host != shm::host_identity()) {
      ok = false;
      disabled_reason_ = "rank " + std::to_string(r) + " is on another host";
    }
  }
  if (ok && owner_fd < 0) {
    ok = false;
    disabled_reason_ = "rank 0 could not create the segment";
  }
  if (ok) {
    const std::string path =
        "/proc/" + std::to_string(owner_pid) + "/fd/" + std::to_string(owner_fd);
    const int f = rank_ == 0 ? fd_ : open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (f < 0) {
      ok = false;
      disabled_reason_ = "cannot open " + path + ": " + strerror(errno);
    } else {
      void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
      if (f != fd_) close(f);
      if (m == MAP_FAILED) {
        ok = false;
        disabled_reason_ = std::string("cannot map the segment: ") + strerror(errno);
      } else {
        map_ = static_cast<char*>(m);
        data_ = map_ + header;
      }
    }
  }
  enabled_ = shm::every_rank_succeeded(exchange, ok, disabled_reason_, "map the segment");
}

HostWindow::~HostWindow() {
  if (map_) munmap(map_, mapped_);
  if (fd_ >= 0) close(fd_);
}

void HostWindow::release(uint32_t epoch) {
  uint32_t* w = &words(rank_)->released;
  if (reached(__atomic_load_n(w, __ATOMIC_RELAXED), epoch)) return;
  __atomic_store_n(w, epoch, __ATOMIC_RELEASE);
  shm::wake_all(w);
}

void HostWindow::publish(uint32_t epoch) {
  HP_CHECK(enabled_, "host window: publish on a disabled window (", disabled_reason_, ")");
  release(epoch - 1);
  uint32_t* w = &words(rank_)->published;
  __atomic_store_n(w, epoch, __ATOMIC_RELEASE);
  shm::wake_all(w);
}

void HostWindow::wait_published(uint32_t epoch) {
  wait_all(&RankWords::published, epoch, "part of a host window");
}

void HostWindow::wait_all(uint32_t RankWords::*word, uint32_t epoch, const char* what) {
  for (int64_t r = 0; r < size_; ++r)
    if (r != rank_)
      shm::wait_word(
          &(words(r)->*word), [epoch](uint32_t v) { return reached(v, epoch); }, r,
          pids_[static_cast<size_t>(r)], what);
}

bool HostWindow::published_by_all(uint32_t epoch) const {
  for (int64_t r = 0; r < size_; ++r)
    if (!reached(__atomic_load_n(&words(r)->published, __ATOMIC_ACQUIRE), epoch)) return false;
  return true;
}

void HostWindow::wait_released(uint32_t epoch) {
  wait_all(&RankWords::released, epoch, "release of a host window");
}

}  // namespace hyperpar::comm
