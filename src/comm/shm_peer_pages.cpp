#include "shm_peer_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <iterator>

#include "env_byte_count.h"

namespace hyperpar::comm {

namespace {
// Ranges are kept in whole 64 KiB windows: a read fault maps up to 16 pages around the page
// it hit, within such a window (the kernel's fault-around), and those must be dropped too.
constexpr uintptr_t kWindow = 64 << 10;
}  // namespace

void ShmPeerPages::read(const char* mapping, size_t mapping_bytes, const char* p, size_t bytes) {
  if (bytes == 0) return;
  const auto lo = reinterpret_cast<uintptr_t>(mapping), hi = lo + mapping_bytes;
  uintptr_t first = std::max(lo, reinterpret_cast<uintptr_t>(p) / kWindow * kWindow);
  uintptr_t end =
      std::min(hi, (reinterpret_cast<uintptr_t>(p) + bytes + kWindow - 1) / kWindow * kWindow);
  std::lock_guard<std::mutex> lock(mutex_);
  // Merge with every kept range that overlaps or touches [first, end).
  auto it = kept_.upper_bound(first);
  if (it != kept_.begin() && std::prev(it)->second >= first) --it;
  while (it != kept_.end() && it->first <= end) {
    first = std::min(first, it->first);
    end = std::max(end, it->second);
    kept_bytes_ -= it->second - it->first;
    it = kept_.erase(it);
  }
  kept_[first] = end;
  kept_bytes_ += end - first;
  if (kept_bytes_ > budget_) drop_all_locked();
}

void ShmPeerPages::drop_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_all_locked();
}

void ShmPeerPages::drop_all_locked() {
  for (const auto& [first, end] : kept_)
    madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
  kept_.clear();
  kept_bytes_ = 0;
}

size_t ShmPeerPages::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_bytes_;
}

size_t ShmPeerPages::configured_budget() {
  return env_byte_count("HYPERPAR_SHM_PEER_PAGES_BYTES", "drops them after every read")
      .value_or(size_t{256} << 20);
}

ShmPeerPages& ShmPeerPages::for_process() {
  static auto* pages = new ShmPeerPages(configured_budget());  // never destroyed: collectives
  return *pages;                                               // may run at exit
}

}  // namespace hyperpar::comm
