#pragma once
// ShmPeerPages: which pages of its peers' arenas (shm_arena.h) this process keeps mapped after
// reading them, within a budget (internal to comm/).
//
// A rank that sums its chunk of a lent gradient maps the owner's pages as it reads them
// (minor faults, 16 pages at a time). The next step's gradients mostly lie where this step's
// did, so keeping the pages mapped makes the next read fault-free: on FSDP8 the faults and
// the unmapping cost ~2% of a step's CPU. The price is RSS: each kept page counts in the
// reader's RSS too, though it is one physical page, owned (and charged) once. So the pages
// kept are bounded: once the distinct bytes kept pass the budget, every kept page is dropped
// at once (the data stays in the peers' arenas) and counting starts again.
//
//   ShmPeerPages kept(64 << 20);
//   sum_from(peer_chunk, bytes);  // peer_chunk within a peer's arena mapped at `arena`
//   kept.read(arena, arena_bytes, peer_chunk, bytes);  // kept, or all dropped past 64 MiB
//
// The process's one instance (for_process) takes its budget from
// HYPERPAR_SHM_PEER_PAGES_BYTES (default 256 MiB; 0 drops the pages after every read).
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace hyperpar::comm {

class ShmPeerPages {
 public:
  explicit ShmPeerPages(size_t budget_bytes) : budget_(budget_bytes) {}
  ShmPeerPages(const ShmPeerPages&) = delete;
  ShmPeerPages& operator=(const ShmPeerPages&) = delete;

  /// After reading [p, p + bytes) of a peer's arena mapping [mapping, mapping +
  /// mapping_bytes): its pages are kept mapped (in whole 64 KiB windows, what a read fault may
  /// have mapped around them, clipped to the mapping: never a neighbouring mapping's pages,
  /// which dropping would zero were they private), or, when that takes the kept bytes past
  /// the budget, every kept page (these included) is dropped from this process's mapping.
  void read(const char* mapping, size_t mapping_bytes, const char* p, size_t bytes);
  /// Drops every kept page now.
  void drop_all();
  /// Distinct bytes of peers' pages now kept mapped (whole windows: at least what is resident).
  size_t kept_bytes() const;
  size_t budget() const { return budget_; }

  /// The budget from the environment: HYPERPAR_SHM_PEER_PAGES_BYTES, else 256 MiB. Throws
  /// Error naming the variable when it is not a byte count.
  static size_t configured_budget();
  /// The process's tracker, made on first use with configured_budget().
  static ShmPeerPages& for_process();

 private:
  void drop_all_locked();

  const size_t budget_;
  mutable std::mutex mutex_;
  std::map<uintptr_t, uintptr_t> kept_;  // first page -> end, disjoint and never adjacent
  size_t kept_bytes_ = 0;
};

}  // namespace hyperpar::comm
