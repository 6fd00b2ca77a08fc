// ShmPeerPages (src/comm/shm_peer_pages.h): pages of a peer's arena that were read stay mapped
// (resident in this process's mapping, counted once however often read) until the distinct
// bytes kept pass the budget, when all are dropped from the mapping (the data stays); the
// environment's budget is checked.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "../src/comm/shm_arena.h"
#include "../src/comm/shm_peer_pages.h"
#include "hyperpar/core/error.h"

using hyperpar::comm::ShmArena;
using hyperpar::comm::ShmPeerPages;

namespace {

constexpr size_t kKiB = 1024, kMiB = kKiB * kKiB;

// KiB of the mapping that holds `addr` resident in this process (/proc/self/smaps "Rss:").
size_t resident_kib(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_vma = false;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(' ') > line.find('-')) {
      in_vma = lo <= a && a < hi;
    } else if (in_vma && line.rfind("Rss:", 0) == 0) {
      std::istringstream in(line.substr(4));
      size_t kib = 0;
      in >> kib;
      return kib;
    }
  }
  ADD_FAILURE() << "no mapping holds " << addr;
  return 0;
}

// A peer's view of 4 MiB its owner wrote: this process's own mapping of `arena`.
const char* peer_view(ShmArena& arena, at::Tensor& owned) {
  owned = at::detail::empty_generic({int64_t{1} << 20}, &arena,
                                    c10::DispatchKeySet(c10::DispatchKey::CPU), at::kFloat,
                                    std::nullopt);
  owned.fill_(2.0f);
  const auto lent = ShmArena::lendable(owned);
  EXPECT_TRUE(lent.has_value());
  std::string error;
  const char* base = ShmArena::map_peer(getpid(), lent->fd, lent->id, lent->arena_bytes, &error);
  EXPECT_NE(base, nullptr) << error;
  return base + lent->offset;
}

// The first 64 KiB boundary of the address space at or after p (where the kernel's
// fault-around windows start).
const char* next_window(const char* p) {
  const uintptr_t w = 64 * kKiB;
  return reinterpret_cast<const char*>((reinterpret_cast<uintptr_t>(p) + w - 1) / w * w);
}

// Reads every float of [p, p + bytes) (volatile: the reads are what the test is about).
float sum_of(const char* p, size_t bytes) {
  float s = 0;
  for (size_t i = 0; i < bytes / sizeof(float); ++i)
    s += reinterpret_cast<const volatile float*>(p)[i];
  return s;
}

}  // namespace

TEST(ShmPeerPages, KeepsWhatWasReadMappedUntilTheBudgetThenDropsItAll) {
  ShmArena arena(16 * kMiB, 64 << 10);
  at::Tensor owned;
  const char* whole = peer_view(arena, owned);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(resident_kib(whole), 0u) << "nothing read yet";
  // Reads from a window boundary; the 4 MiB block holds 3 MiB beyond it.
  const char* peer = next_window(whole);
  ShmPeerPages kept(2 * kMiB);
  EXPECT_EQ(sum_of(peer, kMiB), 2.0f * kMiB / 4);
  kept.read(whole, 4 * kMiB, peer, kMiB);
  EXPECT_EQ(kept.kept_bytes(), kMiB);
  // Resident: what was read, and what the read faults mapped around it (<= one 64 KiB window).
  EXPECT_GE(resident_kib(peer), 1024u) << "kept mapped: the next read does not fault";
  EXPECT_LE(resident_kib(peer), 1024u + 64);
  // Read again, overlapping, and within what is kept: counted once, merged.
  sum_of(peer + 512 * kKiB, kMiB);
  kept.read(whole, 4 * kMiB, peer + 512 * kKiB, kMiB);
  kept.read(whole, 4 * kMiB, peer + 100, 10);
  EXPECT_EQ(kept.kept_bytes(), kMiB + 512 * kKiB);
  // A range across a window boundary: both windows are kept whole.
  sum_of(peer + 1660 * kKiB + 100, 4096);
  kept.read(whole, 4 * kMiB, peer + 1660 * kKiB + 100, 4096);
  EXPECT_EQ(kept.kept_bytes(), kMiB + 512 * kKiB + 128 * kKiB);
  EXPECT_GE(resident_kib(peer), 1536u + 8);
  EXPECT_LE(resident_kib(peer), kept.kept_bytes() / kKiB);
  // Past the budget: everything kept is dropped from this mapping; the data stays.
  sum_of(peer + 2 * kMiB, kMiB);
  kept.read(whole, 4 * kMiB, peer + 2 * kMiB, kMiB);
  EXPECT_EQ(kept.kept_bytes(), 0u);
  EXPECT_EQ(resident_kib(peer), 0u);
  EXPECT_EQ(sum_of(whole, 4 * kMiB), 2.0f * kMiB) << "the owner's data is untouched";
  kept.read(whole, 4 * kMiB, whole, 4 * kMiB);
  kept.drop_all();
  EXPECT_EQ(kept.kept_bytes(), 0u);
  EXPECT_EQ(resident_kib(peer), 0u);
}

TEST(ShmPeerPages, ABudgetOfZeroDropsAfterEveryRead) {
  ShmArena arena(16 * kMiB, 64 << 10);
  at::Tensor owned;
  const char* peer = peer_view(arena, owned);
  ASSERT_NE(peer, nullptr);
  ShmPeerPages kept(0);
  sum_of(peer, kMiB);
  kept.read(peer, 4 * kMiB, peer, kMiB);
  EXPECT_EQ(kept.kept_bytes(), 0u);
  EXPECT_EQ(resident_kib(peer), 0u);
}

TEST(ShmPeerPages, WindowsAreClippedToTheMapping) {
  // A "mapping" that starts 4 KiB past a 64 KiB boundary: the window of a read at its start
  // begins at the mapping, not at the boundary, and dropping it leaves the page before alone
  // (were that page a neighbouring private mapping's, dropping would zero it).
  ShmArena arena(16 * kMiB, 64 << 10);
  at::Tensor owned;
  const char* whole = peer_view(arena, owned);
  ASSERT_NE(whole, nullptr);
  const char* boundary = next_window(whole);
  const char* mapping = boundary + 4 * kKiB;
  const size_t mapping_bytes = 2 * kMiB - 8 * kKiB;  // ends 4 KiB short of a boundary too
  ShmPeerPages kept(16 * kMiB);
  sum_of(boundary, 4);  // the page before the mapping, resident
  sum_of(mapping, 4);
  kept.read(mapping, mapping_bytes, mapping, 4);
  EXPECT_EQ(kept.kept_bytes(), 60 * kKiB);
  const char* last = mapping + mapping_bytes - 4;
  sum_of(last, 4);
  kept.read(mapping, mapping_bytes, last, 4);
  EXPECT_EQ(kept.kept_bytes(), 120 * kKiB) << "the last window ends with the mapping";
  EXPECT_GE(resident_kib(whole), 4u);
  kept.drop_all();
  // Left: the page before the mapping and the one after it (fault-around mapped the
  // boundary windows whole; the reads' windows, clipped, are dropped). Unclipped: none.
  EXPECT_EQ(resident_kib(whole), 8u);
  EXPECT_EQ(sum_of(boundary, 4), 2.0f);
}

TEST(ShmPeerPages, TheEnvironmentsBudgetMustBeAByteCount) {
  for (const char* bad : {"256M", "-1", "99999999999999999999999"}) {
    ::setenv("HYPERPAR_SHM_PEER_PAGES_BYTES", bad, 1);
    try {
      ShmPeerPages::configured_budget();
      ADD_FAILURE() << "accepted HYPERPAR_SHM_PEER_PAGES_BYTES=" << bad;
    } catch (const hyperpar::Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "HYPERPAR_SHM_PEER_PAGES_BYTES must be a byte count (digits only, 0 drops "
                    "them after every read), got '" +
                    std::string(bad) + "'"),
                std::string::npos)
          << e.what();
    }
  }
  ::setenv("HYPERPAR_SHM_PEER_PAGES_BYTES", "0", 1);
  EXPECT_EQ(ShmPeerPages::configured_budget(), 0u);
  ::setenv("HYPERPAR_SHM_PEER_PAGES_BYTES", "1048576", 1);
  EXPECT_EQ(ShmPeerPages::configured_budget(), kMiB);
  ::unsetenv("HYPERPAR_SHM_PEER_PAGES_BYTES");
  EXPECT_EQ(ShmPeerPages::configured_budget(), 256 * kMiB) << "the default";
}
