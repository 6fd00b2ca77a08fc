#pragma once
// ShmArena: a LibTorch CPU allocator whose large blocks live in one memfd that the other
// processes of the host can map (internal to comm/). With it installed as the process's CPU
// allocator, a gradient that autograd computes is already in shared memory, so a
// shared-memory reduce-scatter (shm_collective.h) lends it to its peers where it lies instead
// of copying it into the ring first: each peer sums its chunk straight from this process's
// arena (FSDP8 on 8 ranks: the copy was ~4% of a step's CPU time).
//
// Blocks of at least `min_bytes` come from the arena (best fit over the free ranges, page
// granular, neighbours merged when freed); smaller ones, and any that find no room, come from
// LibTorch's default allocator. Freed pages stay mapped for the next block (a caching
// allocator, as glibc keeps its arenas), so RSS holds the peak of what was in use. A child
// forked after the arena was made does not inherit its pages (they are shared, not copied on
// write: the child would change its parent's tensors) and allocates from the default allocator.
//
//   ShmArena arena(size_t{1} << 30, 64 << 10);
//   at::Tensor t = at::detail::empty_generic({1 << 20}, &arena, ...);  // in the arena
//   auto lent = ShmArena::lendable(t);  // {fd, capacity, offset}: where a peer reads it
//   const char* p =  // in a peer process, from the note that lent it
//       ShmArena::map_peer(owner_pid, lent->fd, lent->id, lent->arena_bytes, &error) +
//       lent->offset;
//
// The process's own arena is installed once (install_for_process) by the first group with
// shared-memory rings; HYPERPAR_SHM_ARENA=0 turns it off, HYPERPAR_SHM_ARENA_BYTES sets its
// size (default: the host's physical memory; the memfd is sparse, pages exist once written).
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace hyperpar::comm {

class ShmArena final : public c10::Allocator {
 public:
  /// An arena of `capacity` bytes serving blocks of at least `min_bytes`. enabled() is false
  /// (every block then comes from the default allocator) when the memfd cannot be made.
  ShmArena(size_t capacity, size_t min_bytes);
  ~ShmArena() override;
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  c10::DataPtr allocate(size_t n) override;
  /// Frees any pointer this allocator handed out (LibTorch's raw_allocate/raw_deallocate).
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool enabled() const { return base_ != nullptr; }
  int fd() const { return fd_; }
  uint64_t id() const { return id_; }
  size_t capacity() const { return capacity_; }
  /// Bytes of arena blocks now allocated, and the most there ever were.
  size_t bytes_in_use() const;
  size_t peak_bytes() const;
  /// Blocks of at least min_bytes that found no room and came from the default allocator.
  uint64_t fallbacks() const;

  /// Where a peer on this host reads `t`'s data: set when t's storage is a block of some
  /// ShmArena (and t is contiguous), else nothing.
  struct Lent {
    int fd;              // the arena's memfd in its owner process
    uint64_t id;         // the memfd's inode: which arena that fd is (fds are reused)
    size_t arena_bytes;  // its size: what a peer maps
    size_t offset;       // of t's first element in the arena
  };
  static std::optional<Lent> lendable(const at::Tensor& t);

  /// Arena `id` (Lent::id), open as `fd` in process `pid` (same host), mapped read-only into
  /// this process once and kept for the process's life. nullptr (with the reason in `error`)
  /// when it cannot be, or when that fd is no longer that arena.
  static const char* map_peer(int64_t pid, int fd, uint64_t id, size_t arena_bytes,
                              std::string* error);

  /// The process arena's size from the environment: 0 when HYPERPAR_SHM_ARENA=0 (or
  /// HYPERPAR_SHM_ARENA_BYTES=0), else HYPERPAR_SHM_ARENA_BYTES or the physical memory.
  /// Throws Error naming the variable when it is not a byte count.
  static size_t configured_bytes();

  /// Installs the process's arena as LibTorch's CPU allocator, once (later calls return the
  /// same one). nullptr when HYPERPAR_SHM_ARENA=0 or the arena cannot be made.
  static ShmArena* install_for_process();

 private:
  static void release(void* p);
  static ShmArena* owning(const void* p);  // the live arena p lies in, if any
  void free_block(size_t offset);

  size_t capacity_, min_bytes_;
  int fd_ = -1;
  uint64_t id_ = 0;
  char* base_ = nullptr;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;            // offset -> bytes, disjoint and never adjacent
  std::unordered_map<size_t, size_t> used_;  // offset -> bytes of each allocated block
  size_t in_use_ = 0, peak_ = 0;
  size_t extent_ = 0;  // the end of the highest block ever handed out
  uint64_t fallbacks_ = 0;
};

}  // namespace hyperpar::comm
