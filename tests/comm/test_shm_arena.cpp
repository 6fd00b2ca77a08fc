// ShmArena (src/comm/shm_arena.h): large blocks come from the shared arena, page aligned, best
// fit, merged with free neighbours when freed; small ones and those that find no room come from
// LibTorch's default allocator; a peer mapping of the arena reads what the owner wrote; a forked
// child allocates elsewhere; the environment's size is checked.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "../src/comm/shm_arena.h"

using hyperpar::comm::ShmArena;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

at::Tensor floats_in(ShmArena& arena, int64_t n) {
  return at::detail::empty_generic({n}, &arena, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   at::kFloat, std::nullopt);
}

size_t offset_of(const at::Tensor& t) {
  auto lent = ShmArena::lendable(t);
  EXPECT_TRUE(lent.has_value());
  return lent ? lent->offset : SIZE_MAX;
}

}  // namespace

TEST(ShmArena, LargeBlocksComeFromTheArenaAndSmallOnesFromTheDefaultAllocator) {
  ShmArena arena(16 * kMiB, 64 << 10);
  ASSERT_TRUE(arena.enabled());
  at::Tensor big = floats_in(arena, 1 << 18);  // 1 MiB
  at::Tensor small = floats_in(arena, 100);    // 400 bytes
  ASSERT_TRUE(ShmArena::lendable(big).has_value());
  EXPECT_EQ(ShmArena::lendable(big)->fd, arena.fd());
  EXPECT_EQ(ShmArena::lendable(big)->arena_bytes, arena.capacity());
  EXPECT_EQ(ShmArena::lendable(big)->id, arena.id());
  EXPECT_EQ(offset_of(big) % 4096, 0u);
  EXPECT_FALSE(ShmArena::lendable(small).has_value());
  EXPECT_FALSE(ShmArena::lendable(at::ones({1 << 18})).has_value()) << "not from an arena";
  EXPECT_EQ(arena.bytes_in_use(), kMiB);
  // A slice is lendable at its own offset; a non-contiguous view is not.
  {
    at::Tensor rows = big.view({512, 512});
    EXPECT_EQ(ShmArena::lendable(rows.narrow(0, 3, 2))->offset, offset_of(big) + 3 * 512 * 4);
    EXPECT_FALSE(ShmArena::lendable(rows.t()).has_value());
  }
  big = at::Tensor();
  EXPECT_EQ(arena.bytes_in_use(), 0u);
  EXPECT_EQ(arena.peak_bytes(), kMiB);
}

TEST(ShmArena, FreedBlocksAreReusedBestFitAndMergedWithTheirNeighbours) {
  ShmArena arena(16 * kMiB, 64 << 10);
  at::Tensor a = floats_in(arena, 1 << 18), b = floats_in(arena, 1 << 18),
             c = floats_in(arena, 1 << 18);
  const size_t oa = offset_of(a), ob = offset_of(b), oc = offset_of(c);
  EXPECT_EQ(ob, oa + kMiB);
  EXPECT_EQ(oc, ob + kMiB);
  // One free MiB between a and c, and the rest of the arena after c: a 1 MiB block takes the
  // hole (best fit), not the large tail.
  b = at::Tensor();
  EXPECT_EQ(offset_of(floats_in(arena, 1 << 18)), ob);
  // a and b freed merge into one 2 MiB range, which a 2 MiB block fits exactly.
  a = at::Tensor();
  EXPECT_EQ(offset_of(floats_in(arena, 1 << 19)), oa);
}

TEST(ShmArena, BlocksThatFindNoRoomComeFromTheDefaultAllocator) {
  ShmArena arena(2 * kMiB, 64 << 10);
  at::Tensor fits = floats_in(arena, 1 << 18);
  at::Tensor too_big = floats_in(arena, 3 << 18);  // 3 MiB
  EXPECT_TRUE(ShmArena::lendable(fits).has_value());
  EXPECT_FALSE(ShmArena::lendable(too_big).has_value());
  EXPECT_EQ(arena.fallbacks(), 1u);
  too_big.fill_(2.0f);  // usable memory all the same
  EXPECT_EQ(too_big.sum().item<float>(), 2.0f * (3 << 18));
}

TEST(ShmArena, RawAllocationsAreFreedThroughTheRawDeleter) {
  // LibTorch's raw_allocate (oneDNN's scratch memory, for one) needs context == data and frees
  // through raw_deleter(), arena blocks and default-allocator ones alike.
  ShmArena arena(8 * kMiB, 64 << 10);
  void* big = arena.raw_allocate(kMiB);
  void* small = arena.raw_allocate(100);
  std::memset(big, 7, kMiB);
  std::memset(small, 7, 100);
  EXPECT_EQ(arena.bytes_in_use(), kMiB);
  arena.raw_deallocate(big);
  arena.raw_deallocate(small);
  EXPECT_EQ(arena.bytes_in_use(), 0u);
}

TEST(ShmArena, APeerMappingReadsWhatTheOwnerWrote) {
  ShmArena arena(8 * kMiB, 64 << 10);
  at::Tensor t = floats_in(arena, 1 << 18);
  t.copy_(at::arange(1 << 18, at::kFloat));
  const auto lent = ShmArena::lendable(t);
  std::string error;
  const char* peer = ShmArena::map_peer(getpid(), lent->fd, lent->id, lent->arena_bytes, &error);
  ASSERT_NE(peer, nullptr) << error;
  EXPECT_NE(peer + lent->offset, static_cast<const char*>(t.data_ptr())) << "a second mapping";
  EXPECT_EQ(std::memcmp(peer + lent->offset, t.data_ptr(), kMiB), 0);
  t.fill_(-1.0f);  // shared pages: the peer sees the change at once
  EXPECT_EQ(reinterpret_cast<const float*>(peer + lent->offset)[123], -1.0f);
  EXPECT_EQ(ShmArena::map_peer(getpid(), 9999, lent->id, 4096, &error), nullptr);
  EXPECT_NE(error.find("/fd/9999"), std::string::npos) << error;
  // The fd names another file now (fds are reused): refused, not mapped.
  EXPECT_EQ(ShmArena::map_peer(getpid(), lent->fd, lent->id + 1, 4096, &error), nullptr);
  EXPECT_NE(error.find("is no longer the arena"), std::string::npos) << error;
}

TEST(ShmArena, AForkedChildAllocatesOutsideTheArena) {
  ShmArena arena(8 * kMiB, 64 << 10);
  at::Tensor before = floats_in(arena, 1 << 18);
  ASSERT_TRUE(ShmArena::lendable(before).has_value());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(30);  // bounded: a child that hangs ends, and the test fails on its status
    // No ATen kernels here: the parent's OpenMP threads do not exist in the child.
    at::Tensor in_child = floats_in(arena, 1 << 18);
    std::memset(in_child.data_ptr(), 1, kMiB);
    _exit(ShmArena::lendable(in_child).has_value() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(ShmArena, TheEnvironmentSetsOrTurnsOffTheProcessArena) {
  ::setenv("HYPERPAR_SHM_ARENA_BYTES", "1048576", 1);
  EXPECT_EQ(ShmArena::configured_bytes(), kMiB);
  ::setenv("HYPERPAR_SHM_ARENA", "0", 1);
  EXPECT_EQ(ShmArena::configured_bytes(), 0u);
  ::unsetenv("HYPERPAR_SHM_ARENA");
  ::unsetenv("HYPERPAR_SHM_ARENA_BYTES");
  EXPECT_GT(ShmArena::configured_bytes(), 0u) << "the physical memory by default";
  for (const char* bad : {"12x", "-5", "1e9"}) {
    ::setenv("HYPERPAR_SHM_ARENA_BYTES", bad, 1);
    try {
      ShmArena::configured_bytes();
      ADD_FAILURE() << "accepted HYPERPAR_SHM_ARENA_BYTES=" << bad;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("HYPERPAR_SHM_ARENA_BYTES must be a byte count"),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("HYPERPAR_SHM_ARENA_BYTES");
}
