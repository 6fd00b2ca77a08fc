// HostWindow (comm/host_window.h) in one process: ranks on threads, one segment mapped by
// all. What one rank writes the others read in place once it is published; a writer's
// wait_released holds until every other rank has released the previous epoch, explicitly or
// by publishing the next; ranks on different hosts disable the window on every rank; ranks
// asking for different sizes get an error naming the mismatch.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "hyperpar/comm/host_window.h"
#include "hyperpar/core/error.h"
#include "local_exchange.h"

using hyperpar::comm::HostWindow;
using hyperpar::comm::testing::LocalExchange;

namespace {

// n windows of `bytes` (rank r asks for bytes[r]), built collectively on n threads; a rank
// whose constructor threw gets nullptr and its message in `errors`.
std::vector<std::unique_ptr<HostWindow>> windows(const std::vector<size_t>& bytes,
                                                 const std::vector<std::string>& hosts = {},
                                                 std::vector<std::string>* errors = nullptr) {
  const int64_t n = static_cast<int64_t>(bytes.size());
  LocalExchange ex(n);
  std::vector<std::unique_ptr<HostWindow>> out(bytes.size());
  std::vector<std::string> errs(bytes.size());
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      const std::string host = r < static_cast<int64_t>(hosts.size()) ? hosts[r] : "";
      try {
        out[r] = std::make_unique<HostWindow>(ex.for_rank(r, host), n, r, bytes[r]);
      } catch (const std::exception& e) {
        errs[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (errors) *errors = errs;
  return out;
}

// Runs f on another thread; whether it finished within `ms`.
bool finishes_within(std::thread& t, std::atomic<bool>& done, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!done && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool finished = done;
  if (finished) t.join();
  return finished;
}

}  // namespace

TEST(HostWindow, EveryRankReadsEveryPartInPlaceOncePublished) {
  auto w = windows({3 * 64, 3 * 64, 3 * 64});
  for (auto& x : w) ASSERT_TRUE(x && x->enabled()) << (x ? x->disabled_reason() : "");
  EXPECT_EQ(w[0]->bytes(), 3u * 64);
  EXPECT_NE(w[0]->data(), w[1]->data());  // one segment, mapped at each rank's own address
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(w[r]->data()[r * 64], 0) << "a new window is zero";
    std::snprintf(w[r]->data() + r * 64, 64, "rank %d, epoch 1", r);
    w[r]->publish(1);
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(w[r]->published_by_all(1));
    EXPECT_FALSE(w[r]->published_by_all(2));
    w[r]->wait_published(1);
    for (int q = 0; q < 3; ++q)
      EXPECT_EQ(std::string(w[r]->data() + q * 64), "rank " + std::to_string(q) + ", epoch 1");
  }
}

TEST(HostWindow, AWriterWaitsUntilEveryPeerReleasedThePreviousEpoch) {
  auto w = windows({64, 64});
  ASSERT_TRUE(w[0]->enabled());
  w[0]->publish(1);
  w[1]->publish(1);
  w[1]->wait_published(1);  // rank 1 reads epoch 1 and has not released it
  std::atomic<bool> done{false};
  std::thread writer([&] {
    w[0]->release(1);
    w[0]->wait_released(1);  // before rank 0 may change its part for epoch 2
    done = true;
  });
  EXPECT_FALSE(finishes_within(writer, done, 200)) << "rank 0 went on while rank 1 still read";
  w[1]->release(1);
  EXPECT_TRUE(finishes_within(writer, done, 5000));
  if (!done) writer.join();
}

TEST(HostWindow, PublishingTheNextEpochReleasesThePreviousOne) {
  auto w = windows({64, 64});
  w[0]->publish(1);
  w[1]->publish(1);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    w[0]->wait_released(1);
    done = true;
  });
  EXPECT_FALSE(finishes_within(writer, done, 100));
  w[1]->publish(2);  // rank 1 moved on: done with epoch 1
  EXPECT_TRUE(finishes_within(writer, done, 5000));
  if (!done) writer.join();
  EXPECT_FALSE(w[0]->published_by_all(2));
  w[0]->publish(2);
  EXPECT_TRUE(w[1]->published_by_all(2));
}

TEST(HostWindow, RanksOnTwoHostsDisableItOnEveryRank) {
  auto w = windows({64, 64}, {"", "elsewhere/boot"});
  for (auto& x : w) {
    ASSERT_TRUE(x);
    EXPECT_FALSE(x->enabled());
    EXPECT_NE(x->disabled_reason().find("another host"), std::string::npos) << x->disabled_reason();
  }
  EXPECT_THROW(w[0]->publish(1), hyperpar::Error);
}

TEST(HostWindow, DifferentSizesAreAnErrorOnEveryRank) {
  std::vector<std::string> errors;
  auto w = windows({64, 128}, {}, &errors);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(w[r]) << "rank " << r;
    EXPECT_NE(errors[r].find("same order on every rank"), std::string::npos) << errors[r];
  }
}
