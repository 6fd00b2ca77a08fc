#include "shm_arena.h"

#include <c10/core/CPUAllocator.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "env_byte_count.h"
#include "hyperpar/core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define HP_ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define HP_ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define HP_ARENA_POISON(p, n) ((void)(p), (void)(n))
#define HP_ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace hyperpar::comm {

namespace {

constexpr size_t kPage = 4096;

// Set in a child forked after an arena was made. The arena's pages are shared, not copied on
// write: a child writing them would change its parent's tensors. They are not mapped in the
// child at all (MADV_DONTFORK: touching one fails loudly), and the child allocates elsewhere.
std::atomic<bool> forked_child{false};

size_t pages(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// Every live arena by its base address: which one a freed pointer belongs to (a DataPtr's
// context must be its data pointer, for LibTorch's raw_allocate / raw_deallocate).
std::mutex registry_mutex;
std::map<const char*, ShmArena*>& registry() {
  static auto* arenas = new std::map<const char*, ShmArena*>();  // never destroyed
  return *arenas;
}

}  // namespace

ShmArena* ShmArena::owning(const void* p) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().upper_bound(c);
  if (it == registry().begin()) return nullptr;
  --it;
  ShmArena* a = it->second;
  return c < a->base_ + a->capacity_ ? a : nullptr;
}

ShmArena::ShmArena(size_t capacity, size_t min_bytes)
    : capacity_(pages(capacity)), min_bytes_(std::max<size_t>(min_bytes, 1)) {
  if (capacity_ == 0) return;
  fd_ = static_cast<int>(memfd_create("hyperpar-shm-arena", MFD_CLOEXEC));
  if (fd_ < 0) return;
  void* m = MAP_FAILED;
  if (ftruncate(fd_, static_cast<off_t>(capacity_)) == 0)
    m = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  if (m == MAP_FAILED) {
    close(fd_);
    fd_ = -1;
    return;
  }
  struct stat st {};
  if (fstat(fd_, &st) == 0) id_ = static_cast<uint64_t>(st.st_ino);
  madvise(m, capacity_, MADV_DONTFORK);
  static const bool child_handler =
      pthread_atfork(nullptr, nullptr, [] { forked_child.store(true); }) == 0;
  (void)child_handler;
  base_ = static_cast<char*>(m);
  free_.emplace(0, capacity_);
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[base_] = this;
}

ShmArena::~ShmArena() {
  if (base_) {
    {
      std::lock_guard<std::mutex> lock(registry_mutex);
      registry().erase(base_);
    }
    HP_ARENA_UNPOISON(base_, extent_);  // the next mapping here must not look freed to ASan
    munmap(base_, capacity_);
  }
  if (fd_ >= 0) close(fd_);
}

c10::DataPtr ShmArena::allocate(size_t n) {
  if (base_ && n >= min_bytes_ && !forked_child.load(std::memory_order_relaxed)) {
    const size_t want = pages(n);
    std::lock_guard<std::mutex> lock(mutex_);
    // Best fit: the smallest free range that holds the block, lowest offset among equals, so
    // a step's allocations settle into the same places step after step.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= want && (best == free_.end() || it->second < best->second)) best = it;
    if (best != free_.end()) {
      const size_t offset = best->first, left = best->second - want;
      free_.erase(best);
      if (left > 0) free_.emplace(offset + want, left);
      in_use_ += want;
      peak_ = std::max(peak_, in_use_);
      used_.emplace(offset, want);
      extent_ = std::max(extent_, offset + want);
      char* p = base_ + offset;
      HP_ARENA_UNPOISON(p, want);
      return {p, p, &ShmArena::release, c10::Device(c10::kCPU)};
    }
    ++fallbacks_;
  }
  return c10::GetDefaultCPUAllocator()->allocate(n);
}

c10::DeleterFnPtr ShmArena::raw_deleter() const { return &ShmArena::release; }

void ShmArena::release(void* p) {
  if (ShmArena* arena = owning(p))
    arena->free_block(static_cast<size_t>(static_cast<char*>(p) - arena->base_));
  else  // a block that found no room (or too small): the default allocator's, as raw memory
    c10::GetDefaultCPUAllocator()->raw_deleter()(p);
}

void ShmArena::free_block(size_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto used = used_.find(offset);
  HP_CHECK(used != used_.end(), "ShmArena: freeing offset ", offset, ", which is not a block");
  size_t bytes = used->second;
  used_.erase(used);
  HP_ARENA_POISON(base_ + offset, bytes);
  in_use_ -= bytes;
  // Merge with the free neighbours on either side.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace_hint(next, offset, bytes);
}

void ShmArena::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

size_t ShmArena::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

size_t ShmArena::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

uint64_t ShmArena::fallbacks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fallbacks_;
}

std::optional<ShmArena::Lent> ShmArena::lendable(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.is_contiguous() || !t.device().is_cpu())
    return std::nullopt;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &ShmArena::release) return std::nullopt;
  const ShmArena* arena = owning(dp.get());
  if (!arena) return std::nullopt;  // a default-allocator block behind the same deleter
  const auto offset = static_cast<size_t>(static_cast<const char*>(t.data_ptr()) - arena->base_);
  return Lent{arena->fd_, arena->id_, arena->capacity_, offset};
}

const char* ShmArena::map_peer(int64_t pid, int fd, uint64_t id, size_t arena_bytes,
                               std::string* error) {
  static std::mutex m;
  static std::map<std::tuple<int64_t, int, uint64_t>, const char*> maps;  // for the process's life
  std::lock_guard<std::mutex> lock(m);
  const auto key = std::make_tuple(pid, fd, id);
  if (auto it = maps.find(key); it != maps.end()) return it->second;
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int f = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) {
    if (error) *error = "cannot open " + path + ": " + strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(f, &st) != 0 || static_cast<uint64_t>(st.st_ino) != id) {
    close(f);
    if (error) *error = path + " is no longer the arena it was (inode " + std::to_string(id) + ")";
    return nullptr;
  }
  void* p = mmap(nullptr, arena_bytes, PROT_READ, MAP_SHARED | MAP_NORESERVE, f, 0);
  close(f);
  if (p == MAP_FAILED) {
    if (error) *error = "cannot map " + path + ": " + strerror(errno);
    return nullptr;
  }
  madvise(p, arena_bytes, MADV_DONTFORK);  // a forked child has no use for its parent's peers
  return maps[key] = static_cast<const char*>(p);
}

size_t ShmArena::configured_bytes() {
  const char* on = std::getenv("HYPERPAR_SHM_ARENA");
  if (on && std::string(on) == "0") return 0;
  const size_t physical =
      static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return env_byte_count("HYPERPAR_SHM_ARENA_BYTES", "turns the arena off").value_or(physical);
}

ShmArena* ShmArena::install_for_process() {
  static ShmArena* arena = []() -> ShmArena* {
    const size_t bytes = configured_bytes();
    if (bytes == 0) return nullptr;
    // Never destroyed: tensors from it may outlive every other static.
    auto* a = new ShmArena(bytes, size_t{64} << 10);
    if (!a->enabled()) {
      delete a;
      return nullptr;
    }
    c10::SetCPUAllocator(a, /*priority=*/1);
    return a;
  }();
  return arena;
}

}  // namespace hyperpar::comm
