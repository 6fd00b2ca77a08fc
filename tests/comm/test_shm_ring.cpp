// ShmRing (src/comm/shm_ring.h) in one process: two ranks on two threads, each with its own
// segment mapped by both. Regions are handed out lowest free gap first and reused only once
// the peer has read them, in any order; an operation that finds no room gets none (its data
// would go over TCP); a note published later wakes a waiting reader; ranks that are not all
// on one host disable the ring on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "../src/comm/shm_ring.h"
#include "local_exchange.h"

using hyperpar::comm::ShmRing;
using hyperpar::comm::testing::LocalExchange;

namespace {

// Rings of ranks 0 and 1 with `capacity` bytes each, built collectively on two threads.
std::pair<std::unique_ptr<ShmRing>, std::unique_ptr<ShmRing>> two_rings(
    size_t capacity, const std::string& host1 = "") {
  LocalExchange ex(2);
  std::unique_ptr<ShmRing> a, b;
  std::thread t([&] { b = std::make_unique<ShmRing>(ex.for_rank(1, host1), 2, 1, capacity); });
  a = std::make_unique<ShmRing>(ex.for_rank(0), 2, 0, capacity);
  t.join();
  return {std::move(a), std::move(b)};
}

}  // namespace

TEST(ShmRing, PeerReadsWhatTheOwnerPublishedAndTheRegionIsReused) {
  auto [r0, r1] = two_rings(1024);
  ASSERT_TRUE(r0->enabled()) << r0->disabled_reason();
  ASSERT_TRUE(r1->enabled());
  auto region = r0->begin(0, 100);
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(*region, 0u);
  std::strcpy(r0->data(0) + *region, "from rank 0");
  r0->publish(0, region);
  auto note = r1->wait_note(0, 0);
  EXPECT_TRUE(note.in_ring);
  EXPECT_STREQ(r1->data(0) + note.offset, "from rank 0");  // rank 1's mapping of rank 0's
  // Unread, op 0's region stays taken: op 1 goes after it.
  auto second = r0->begin(1, 100);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, 128u);  // 100 bytes rounded up to 64-byte lines
  r0->publish(1, second);
  r1->mark_read(0, 0);
  r1->wait_note(0, 1);
  r1->mark_read(0, 1);
  // Both read: the ring starts over at 0.
  auto third = r0->begin(2, 100);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(*third, 0u);
}

TEST(ShmRing, NoRoomGivesNoRegionAndTheNoteSaysSo) {
  auto [r0, r1] = two_rings(1024);
  auto a = r0->begin(0, 600);
  ASSERT_TRUE(a.has_value());
  r0->publish(0, a);
  auto b = r0->begin(1, 600);  // op 0 unread: 424 bytes left
  EXPECT_FALSE(b.has_value());
  r0->publish(1, b);
  EXPECT_TRUE(r1->wait_note(0, 0).in_ring);
  EXPECT_FALSE(r1->wait_note(0, 1).in_ring);
  EXPECT_FALSE(r0->begin(2, 2048).has_value());  // larger than the ring
  r0->publish(2, std::nullopt);
  for (uint64_t s = 0; s < 3; ++s) r1->mark_read(0, s);
  auto c = r0->begin(3, 600);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, 0u);
}

TEST(ShmRing, ReadRegionsAreFreeInAnyOrderAndTheLowestGapThatFitsIsUsed) {
  auto [r0, r1] = two_rings(1024);
  std::vector<std::optional<size_t>> got;
  for (uint64_t s = 0; s < 3; ++s) {
    got.push_back(r0->begin(s, 256));
    r0->publish(s, got.back());
  }
  EXPECT_EQ(got[0], 0u);
  EXPECT_EQ(got[1], 256u);
  EXPECT_EQ(got[2], 512u);
  for (uint64_t s = 1; s < 3; ++s) {  // ops 1 and 2 read; op 0 (at 0) still unread
    r1->wait_note(0, s);
    r1->mark_read(0, s);
  }
  // Op 0 does not pin the later regions: [256, 1024) is free and op 3 takes its start.
  auto after_oldest = r0->begin(3, 512);
  EXPECT_EQ(after_oldest, 256u);
  r0->publish(3, after_oldest);
  auto end = r0->begin(4, 256);  // [768, 1024), the only gap left
  EXPECT_EQ(end, 768u);
  r0->publish(4, end);
  auto full = r0->begin(5, 64);
  EXPECT_FALSE(full.has_value());
  r0->publish(5, full);
  r1->wait_note(0, 0);
  r1->mark_read(0, 0);
  auto lowest = r0->begin(6, 128);  // [0, 256) is free again
  EXPECT_EQ(lowest, 0u);
  r0->publish(6, lowest);
  auto too_big = r0->begin(7, 200);  // [128, 256) is 128 bytes: no room
  EXPECT_FALSE(too_big.has_value());
  r0->publish(7, too_big);
  auto fits = r0->begin(8, 128);
  EXPECT_EQ(fits, 128u);
  r0->publish(8, fits);
}

TEST(ShmRing, AWaitingReaderIsWokenByALaterPublish) {
  auto [r0, r1] = two_rings(1024);
  std::thread owner([&, &r0 = r0] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    auto region = r0->begin(0, 8);
    std::memcpy(r0->data(0) + *region, "late", 5);
    r0->publish(0, region);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto note = r1->wait_note(0, 0);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  owner.join();
  EXPECT_TRUE(note.in_ring);
  EXPECT_STREQ(r1->data(0) + note.offset, "late");
  EXPECT_GE(waited, 0.1);
}

TEST(ShmRing, RanksOnDifferentHostsDisableItEverywhere) {
  auto [r0, r1] = two_rings(1024, "another-host/boot");
  EXPECT_FALSE(r0->enabled());
  EXPECT_FALSE(r1->enabled());
  EXPECT_NE(r0->disabled_reason().find("another host"), std::string::npos) << r0->disabled_reason();
  EXPECT_FALSE(r0->begin(0, 8).has_value());
}
