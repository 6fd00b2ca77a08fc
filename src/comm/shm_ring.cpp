#include "shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <utility>

#include "hyperpar/core/error.h"
#include "shm_arena.h"
#include "shm_wait.h"

namespace hyperpar::comm {
namespace {

size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

// One per operation slot, in the owner's segment; written by the owner (note) and by the
// readers (reads).
struct ShmRing::Slot {
  uint32_t reads;        // peers done with this slot's operation (reset by the owner on reuse);
                         // a futex word where the data is lent
  uint32_t ready;        // (uint32_t)(seq + 1) once the note is published: the futex word
  uint32_t where;        // 0: over the backend; 1: in the owner's ring; 2: lent from its arena
  int32_t arena_fd;      // lent: the owner's arena (shm_arena.h)
  uint64_t offset;       // where in the owner's data area, or in its arena
  uint64_t arena_bytes;  // lent: the arena's size
  uint64_t arena_id;     // lent: which arena (ShmArena::Lent::id)
};

ShmRing::ShmRing(const Exchange& exchange, int64_t size, int64_t rank, size_t capacity_bytes)
    : size_(size), rank_(rank), capacity_(capacity_bytes) {
  const size_t total = kHeaderBytes + capacity_;
  fd_ = static_cast<int>(memfd_create("hyperpar-shm-ring", MFD_CLOEXEC));
  if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(total)) != 0) {
    close(fd_);
    fd_ = -1;
  }
  std::ostringstream me;
  me << shm::host_identity() << "\n" << getpid() << "\n" << fd_;
  const auto all = exchange(me.str(), 0);
  const std::string my_host = shm::host_identity();
  bool ok = true;
  maps_.assign(static_cast<size_t>(size_), nullptr);
  pids_.assign(static_cast<size_t>(size_), 0);
  for (int64_t r = 0; r < size_ && ok; ++r) {
    std::istringstream in(all[static_cast<size_t>(r)]);
    std::string host;
    int64_t pid = 0, fd = -1;
    std::getline(in, host);
    in >> pid >> fd;
    pids_[static_cast<size_t>(r)] = pid;
    if (host != my_host || fd < 0) {
      ok = false;
      disabled_reason_ = "rank " + std::to_string(r) + " is on another host or has no segment";
      break;
    }
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    const int f = r == rank_ ? fd_ : open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (f < 0) {
      ok = false;
      disabled_reason_ = "cannot open " + path + ": " + strerror(errno);
      break;
    }
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (f != fd_) close(f);
    if (m == MAP_FAILED) {
      ok = false;
      disabled_reason_ = "cannot map rank " + std::to_string(r) + "'s segment: " + strerror(errno);
      break;
    }
    maps_[static_cast<size_t>(r)] = static_cast<char*>(m);
  }
  // Every rank must agree: one rank unable to map a peer disables the ring for all.
  enabled_ = shm::every_rank_succeeded(exchange, ok, disabled_reason_, "map every segment");
  data_.assign(static_cast<size_t>(size_), nullptr);
  for (size_t r = 0; r < maps_.size(); ++r)
    if (maps_[r]) data_[r] = maps_[r] + kHeaderBytes;
}

ShmRing::~ShmRing() {
  for (char* m : maps_)
    if (m) munmap(m, kHeaderBytes + capacity_);
  if (fd_ >= 0) close(fd_);
}

ShmRing::Slot* ShmRing::slot(int64_t owner, uint64_t seq) {
  static_assert(sizeof(Slot) <= kSlotBytes, "a slot fits its cache line");
  return reinterpret_cast<Slot*>(maps_[static_cast<size_t>(owner)] + (seq % kSlots) * kSlotBytes);
}

void ShmRing::reclaim() {
  // Any region every peer has read, not only the oldest: a slow reader of one operation
  // must not pin the (lower) regions of later ones that are already read. The note slot of
  // an operation is only reused kSlots operations later, after it is reclaimed (begin).
  const auto all = static_cast<uint32_t>(size_ - 1);
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [&](const Live& l) {
                               Slot* s = slot(rank_, l.seq);
                               if (__atomic_load_n(&s->reads, __ATOMIC_ACQUIRE) != all)
                                 return false;
                               __atomic_store_n(&s->reads, 0, __ATOMIC_RELAXED);
                               return true;
                             }),
              live_.end());
}

void ShmRing::take_slot(uint64_t seq) {
  reclaim();
  // The note slot is shared with operation seq - kSlots: wait until every peer has read it
  // (only when a peer is kSlots operations behind; never in practice).
  const auto deadline = shm::wait_deadline();
  while (!live_.empty() && seq - live_.front().seq >= kSlots) {
    for (int64_t r = 0; r < size_; ++r)
      if (r != rank_ && shm::process_gone(pids_[static_cast<size_t>(r)]))
        throw PeerError(detail::concat("shared-memory collective: rank ", r, " (pid ",
                                       pids_[static_cast<size_t>(r)], ") exited"));
    HP_CHECK(std::chrono::steady_clock::now() < deadline,
             "shared-memory collective: a peer did not read operation ", live_.front().seq,
             " within the collective timeout");
    usleep(1000);
    reclaim();
  }
}

std::optional<size_t> ShmRing::begin(uint64_t seq, size_t bytes) {
  if (!enabled_) return std::nullopt;
  take_slot(seq);
  bytes = aligned(std::max<size_t>(bytes, 1));
  // The lowest free gap that fits, between the regions still being read. Regions are
  // reclaimed oldest first but placed lowest first, so the pages in use (counted in every
  // reader's RSS, and in the caches) stay about what is in flight instead of sweeping the
  // whole capacity as a plain ring would.
  std::vector<std::pair<size_t, size_t>> used;  // [begin, end) of live regions
  for (const Live& l : live_)
    if (l.in_ring) used.emplace_back(l.offset, l.offset + l.bytes);
  std::sort(used.begin(), used.end());
  std::optional<size_t> at;
  size_t gap = 0;  // regions are disjoint: sorted by start, each starts at or after gap
  for (const auto& [b, e] : used) {
    if (b - gap >= bytes) break;
    gap = e;
  }
  if (capacity_ >= gap && capacity_ - gap >= bytes) at = gap;
  live_.push_back({seq, at.has_value(), at.value_or(0), bytes, nullptr});
  return at;
}

void ShmRing::publish_lent(uint64_t seq, int arena_fd, uint64_t arena_id, size_t arena_bytes,
                           size_t offset, std::shared_ptr<const void> keep) {
  take_slot(seq);
  live_.push_back({seq, false, 0, 0, std::move(keep)});
  Slot* s = slot(rank_, seq);
  s->where = 2;
  s->arena_fd = arena_fd;
  s->offset = offset;
  s->arena_bytes = arena_bytes;
  s->arena_id = arena_id;
  __atomic_store_n(&s->ready, static_cast<uint32_t>(seq + 1), __ATOMIC_RELEASE);
  shm::wake_all(&s->ready);
}

void ShmRing::publish(uint64_t seq, const std::optional<size_t>& region) {
  Slot* s = slot(rank_, seq);
  s->where = region ? 1 : 0;
  s->offset = region.value_or(0);
  __atomic_store_n(&s->ready, static_cast<uint32_t>(seq + 1), __ATOMIC_RELEASE);
  shm::wake_all(&s->ready);
}

void ShmRing::wait_until(int64_t owner, uint32_t* word, uint32_t want, const char* what) {
  shm::wait_word(
      word, [want](uint32_t v) { return v == want; }, owner, pids_[static_cast<size_t>(owner)],
      what);
}

ShmRing::Note ShmRing::wait_note(int64_t owner, uint64_t seq) {
  Slot* s = slot(owner, seq);
  wait_until(owner, &s->ready, static_cast<uint32_t>(seq + 1), "data");
  return Note{s->where == 1, static_cast<size_t>(s->offset),     s->where == 2, s->arena_fd,
              s->arena_id,   static_cast<size_t>(s->arena_bytes)};
}

const char* ShmRing::lent_data(int64_t owner, const Note& note) {
  std::string error;
  const char* arena = ShmArena::map_peer(pids_[static_cast<size_t>(owner)], note.arena_fd,
                                         note.arena_id, note.arena_bytes, &error);
  if (!arena)
    throw PeerError(detail::concat("shared-memory collective: cannot read rank ", owner,
                                   "'s lent data: ", error));
  return arena + note.offset;
}

void ShmRing::mark_read(int64_t owner, uint64_t seq) {
  Slot* s = slot(owner, seq);
  const bool lent = s->where == 2;  // read before the count: the owner may reuse the slot after
  __atomic_fetch_add(&s->reads, 1, __ATOMIC_RELEASE);
  if (lent) shm::wake_all(&s->reads);
}

bool ShmRing::live(uint64_t seq) const {
  return std::any_of(live_.begin(), live_.end(), [seq](const Live& l) { return l.seq == seq; });
}

void ShmRing::wait_all_read(uint64_t seq) {
  reclaim();  // an operation every peer has read is no longer live (its count is reset)
  if (!live(seq)) return;
  std::vector<std::pair<int64_t, int64_t>> peers;
  for (int64_t r = 0; r < size_; ++r)
    if (r != rank_) peers.emplace_back(r, pids_[static_cast<size_t>(r)]);
  const auto all = static_cast<uint32_t>(size_ - 1);
  shm::wait_word(
      &slot(rank_, seq)->reads, [all](uint32_t v) { return v == all; }, peers,
      "read of this rank's lent data");
  reclaim();
}

}  // namespace hyperpar::comm
