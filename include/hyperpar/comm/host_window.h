#pragma once
// HostWindow: one shared-memory region mapped by every rank of a group whose ranks share a
// host (MPI-3's MPI_Win_allocate_shared, synchronised by epochs instead of fences), so that
// what one rank writes the others read in place, with no copy into a receive buffer of their
// own. FSDP keeps a host's unsharded parameters in one (parallel/fsdp.h,
// FSDPOptions::host_shared_params): each rank writes its shard once, every rank computes on
// the whole tensor where it lies.
//
// Uses are numbered by epochs 1, 2, ..., the same sequence on every rank. For epoch e a rank
// writes its part (only if it changed) and publishes e; a reader waits until every rank has
// published e. A rank about to change its part first waits until every other rank has
// released e - 1 (no longer reads what it saw then). Publishing e releases e - 1: a rank
// that moves on to the next epoch is done with the previous one.
//
//   auto w = group->host_window(bytes);   // collective; nullptr: not one host, or no shm
//   w->release(e - 1);                    // this rank is done with epoch e - 1
//   w->wait_released(e - 1);              // only before changing what peers may still read
//   memcpy(w->data() + my_offset, src, n);
//   w->publish(e);
//   w->wait_published(e);                 // every rank's part of epoch e is in place
//   ... read any part of w->data() ...
//
// Waits sleep on futexes, notice a peer's exit (PeerError) and give up after the collective
// timeout (Error) instead of hanging. Threading: one thread of each rank uses a window.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hyperpar::comm {

class HostWindow {
 public:
  /// Publishes this rank's string and returns every rank's, in group rank order (a blocking
  /// exchange through the backend). Called twice: identities (host, pid, segment), then
  /// whether every rank could map the segment.
  using Exchange = std::function<std::vector<std::string>(const std::string& mine, int round)>;

  /// Collective over the group: rank 0 creates the segment, every rank maps it. When the
  /// ranks are not all on one host or a mapping fails anywhere, the window is disabled on
  /// every rank alike (enabled() false, the outcome is exchanged).
  HostWindow(const Exchange& exchange, int64_t size, int64_t rank, size_t bytes);
  ~HostWindow();
  HostWindow(const HostWindow&) = delete;
  HostWindow& operator=(const HostWindow&) = delete;

  bool enabled() const { return enabled_; }
  const std::string& disabled_reason() const { return disabled_reason_; }
  /// The shared bytes (zero when created), 64-byte aligned.
  char* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  /// This rank's part for `epoch` is in place (release order); also releases epoch - 1.
  void publish(uint32_t epoch);
  /// Returns once every rank has published `epoch` or a later one.
  void wait_published(uint32_t epoch);
  /// Whether every rank has published `epoch` or a later one (does not wait).
  bool published_by_all(uint32_t epoch) const;
  /// This rank no longer reads what it saw in `epoch` (or any earlier one).
  void release(uint32_t epoch);
  /// Returns once every other rank has released `epoch` or a later one.
  void wait_released(uint32_t epoch);

 private:
  struct RankWords;  // in shared memory: one pair of futex words per rank
  RankWords* words(int64_t r) const;
  // Waits until every other rank's `word` has reached `epoch`.
  void wait_all(uint32_t RankWords::*word, uint32_t epoch, const char* what);

  int64_t size_, rank_;
  size_t bytes_, mapped_ = 0;
  bool enabled_ = false;
  std::string disabled_reason_;
  int fd_ = -1;
  char* map_ = nullptr;
  char* data_ = nullptr;
  std::vector<int64_t> pids_;
};

}  // namespace hyperpar::comm
