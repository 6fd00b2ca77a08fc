// ShmCollectives (src/comm/shm_collective.h) in one process: three ranks on three threads,
// with rings large enough for every operation, and with rings so small that the larger
// operations find no room and go over the fallback (an in-process mailbox here). All-gather,
// sum and average reduce-scatter and all-reduce must equal the sums computed directly, in rank
// order, bitwise (the same values on every rank); bf16 sums accumulate in float32.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include "../src/comm/shm_arena.h"
#include "../src/comm/shm_collective.h"
#include "hyperpar/core/error.h"
#include "local_exchange.h"

using hyperpar::comm::ShmArena;
using hyperpar::comm::ShmCollectives;
using hyperpar::comm::ShmRing;
using hyperpar::comm::WorkHandle;
using hyperpar::comm::testing::LocalExchange;
using Kind = hyperpar::comm::ShmKind;

namespace {

constexpr int64_t kRanks = 3;

// Point-to-point byte messages between the threads, keyed by (from, to, tag). As MPI's
// rendezvous protocol does for large messages, the receiver copies from the sender's own
// buffer, and a send completes only once it has: a sender that reuses its buffer before
// waiting for its sends corrupts what the peer receives.
class Mailbox {
 public:
  using Key = std::tuple<int64_t, int64_t, int>;
  ShmCollectives::Fallback for_rank(int64_t me) {
    return {[this, me](const at::Tensor& bytes, int64_t peer, int tag) -> WorkHandle {
              const Key key{me, peer, tag};
              {
                std::lock_guard<std::mutex> lock(m_);
                box_[key] = bytes;
                ++messages_;
              }
              cv_.notify_all();
              return std::make_shared<SendWork>(*this, key);
            },
            [this, me](const at::Tensor& bytes, int64_t peer, int tag) {
              std::unique_lock<std::mutex> lock(m_);
              const Key key{peer, me, tag};
              cv_.wait(lock, [&] { return box_.count(key) > 0; });
              ASSERT_EQ(box_[key].numel(), bytes.numel());
              bytes.copy_(box_[key]);
              box_.erase(key);
              cv_.notify_all();
            }};
  }
  int messages() {
    std::lock_guard<std::mutex> lock(m_);
    return messages_;
  }

 private:
  class SendWork final : public hyperpar::comm::Work {
   public:
    SendWork(Mailbox& box, Key key) : box_(box), key_(key) {}
    void wait() override {
      std::unique_lock<std::mutex> lock(box_.m_);
      box_.cv_.wait(lock, [&] { return box_.box_.count(key_) == 0; });
    }
    bool is_completed() override {
      std::lock_guard<std::mutex> lock(box_.m_);
      return box_.box_.count(key_) == 0;
    }

   private:
    Mailbox& box_;
    Key key_;
  };
  std::mutex m_;
  std::condition_variable cv_;
  std::map<Key, at::Tensor> box_;
  int messages_ = 0;
};

// Runs `body(rank, collectives)` on kRanks threads whose rings hold `ring_bytes` each.
void on_ranks(size_t ring_bytes, Mailbox& mail,
              const std::function<void(int64_t, ShmCollectives&)>& body) {
  LocalExchange ex(kRanks);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      auto ring = std::make_unique<ShmRing>(ex.for_rank(r), kRanks, r, ring_bytes);
      ShmCollectives shm(std::move(ring), kRanks, r, mail.for_rank(r));
      ASSERT_TRUE(shm.enabled());
      body(r, shm);
    });
  for (auto& t : threads) t.join();
}

// Each rank's values, without the global generator (the ranks are threads).
at::Tensor rank_data(int64_t r, int64_t n, at::ScalarType dtype = at::kFloat) {
  return at::sin(at::arange(n, at::kFloat) * (0.37 * static_cast<double>(r + 1)) + 0.1 * r)
      .to(dtype);
}

// The three collectives on `n` floats per rank; checked against direct rank-order sums.
void check_collectives(size_t ring_bytes, int64_t n, bool expect_fallback) {
  Mailbox mail;
  std::vector<at::Tensor> gathered(kRanks), scattered(kRanks), averaged(kRanks), reduced(kRanks),
      reduced_bf16(kRanks), averaged_into(kRanks), inputs_after(kRanks), averaged_bf16(kRanks);
  on_ranks(ring_bytes, mail, [&](int64_t r, ShmCollectives& shm) {
    uint64_t call = 0;
    const at::Tensor mine = rank_data(r, n);
    // all-gather (bytes)
    at::Tensor g = at::empty({kRanks * n});
    const at::Tensor in_bytes = mine.view(at::kByte), out_bytes = g.view(at::kByte);
    WorkHandle w1 = shm.start(Kind::kAllGather, out_bytes, in_bytes, call, int(call), false);
    ++call;
    // reduce-scatter (sum) and one that averages, both in flight at once
    const at::Tensor full = at::cat({mine, mine * 2, mine * 3});
    at::Tensor s = at::empty({n}), a = at::empty({n});
    WorkHandle w2 = shm.start(Kind::kReduceScatter, s, full, call, int(call), false);
    ++call;
    WorkHandle w3 = shm.start(Kind::kReduceScatter, a, full, call, int(call), true);
    ++call;
    w3->wait();  // out of issue order
    w1->wait();
    w2->wait();
    // all-reduce in place, float32 and bf16
    at::Tensor t = mine.clone();
    shm.start(Kind::kAllReduce, t, t, call, int(call), false)->wait();
    ++call;
    at::Tensor tb = rank_data(r, n, at::kBFloat16);
    shm.start(Kind::kAllReduce, tb, tb, call, int(call), false)->wait();
    ++call;
    // all-reduce (avg) out of place: the input stays as it was; bf16 avg in place
    const at::Tensor kept = mine.clone();
    at::Tensor ai = at::empty({n});
    shm.start(Kind::kAllReduce, ai, kept, call, int(call), true)->wait();
    ++call;
    at::Tensor ab = rank_data(r, n, at::kBFloat16);
    shm.start(Kind::kAllReduce, ab, ab, call, int(call), true)->wait();
    averaged_into[r] = ai;
    inputs_after[r] = kept;
    averaged_bf16[r] = ab;
    gathered[r] = g;
    scattered[r] = s;
    averaged[r] = a;
    reduced[r] = t;
    reduced_bf16[r] = tb;
  });
  std::vector<at::Tensor> data, data_bf16;
  for (int64_t r = 0; r < kRanks; ++r) {
    data.push_back(rank_data(r, n));
    data_bf16.push_back(rank_data(r, n, at::kBFloat16));
  }
  const at::Tensor sum = data[0] + data[1] + data[2];  // rank order, as the rings add
  const at::Tensor sum_bf16 =
      (data_bf16[0].to(at::kFloat) + data_bf16[1].to(at::kFloat) + data_bf16[2].to(at::kFloat))
          .to(at::kBFloat16);
  for (int64_t r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(at::equal(gathered[r], at::cat(data))) << "all-gather on rank " << r;
    const double k = static_cast<double>(r + 1);  // rank r's chunk holds k * each rank's data
    const at::Tensor chunk_sum = data[0] * k + data[1] * k + data[2] * k;
    EXPECT_TRUE(at::equal(scattered[r], chunk_sum)) << "reduce-scatter on rank " << r;
    EXPECT_TRUE(at::equal(averaged[r], chunk_sum / 3.0)) << "average on rank " << r;
    EXPECT_TRUE(at::equal(reduced[r], sum)) << "all-reduce on rank " << r;
    EXPECT_TRUE(at::equal(reduced_bf16[r], sum_bf16)) << "bf16 all-reduce on rank " << r;
    // The average divides each sum once, as dividing the summed tensor would (bf16: after
    // rounding the sum to bf16).
    EXPECT_TRUE(at::equal(averaged_into[r], sum / 3.0)) << "out-of-place average on rank " << r;
    EXPECT_TRUE(at::equal(inputs_after[r], data[r])) << "out-of-place input changed on rank " << r;
    EXPECT_TRUE(at::equal(averaged_bf16[r], sum_bf16 / 3.0)) << "bf16 average on rank " << r;
  }
  if (expect_fallback)
    EXPECT_GT(mail.messages(), 0) << "the small rings should have sent some operations over the "
                                     "fallback";
  else
    EXPECT_EQ(mail.messages(), 0);
}

}  // namespace

TEST(ShmCollectives, EveryOperationThroughTheRingsMatchesRankOrderSums) {
  check_collectives(size_t{1} << 20, 1000, /*expect_fallback=*/false);
}

TEST(ShmCollectives, OperationsWithoutRoomGoOverTheFallbackWithTheSameResults) {
  // 4 KiB rings: the 12 KB reduce-scatter inputs never fit, the 4000-byte all-gather and
  // all-reduce contributions only when nothing else is in flight; 4400-byte ones never (an
  // all-reduce then sends its own tensor, which it may overwrite only once that is received).
  check_collectives(4096, 1000, /*expect_fallback=*/true);
  check_collectives(4096, 1100, /*expect_fallback=*/true);
}

// Reduce-scatter inputs that lie in their rank's arena (shm_arena.h) are lent, not copied: with
// 4 KiB rings every copied 384 KiB input would go over the fallback, lent ones never do. A rank
// that lets go of its input at once (as FSDP does with a gradient) goes on before its peers have
// read, and its next block must not take the lent one's place; a rank that keeps its input may
// overwrite it once its wait returns (which is after every peer has read). Slow peers (asleep
// until rank 0 has let go and written a new block, or for 100 ms while it waits) must still get
// exact sums.
TEST(ShmCollectives, ReduceScatterLendsArenaInputsWhereTheyLie) {
  Mailbox mail;
  constexpr int64_t n = 1 << 15;  // 128 KiB per chunk
  std::vector<std::unique_ptr<ShmArena>> arenas;
  for (int64_t r = 0; r < kRanks; ++r)
    arenas.push_back(std::make_unique<ShmArena>(size_t{16} << 20, size_t{64} << 10));
  std::vector<at::Tensor> dropped_out(kRanks), kept_out(kRanks);
  std::atomic<bool> rank0_done{false};
  on_ranks(4096, mail, [&](int64_t r, ShmCollectives& shm) {
    ShmArena& arena = *arenas[static_cast<size_t>(r)];
    auto input = [&] {
      at::Tensor t = at::detail::empty_generic({kRanks * n}, &arena,
                                               c10::DispatchKeySet(c10::DispatchKey::CPU),
                                               at::kFloat, std::nullopt);
      t.copy_(at::cat({rank_data(r, n), rank_data(r, n) * 2, rank_data(r, n) * 3}));
      EXPECT_TRUE(ShmArena::lendable(t).has_value());
      return t;
    };
    auto slow_peer = [&] {
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    // 1: the caller lets go of its input once issued.
    at::Tensor out1 = at::empty({n});
    WorkHandle w1 = shm.start(Kind::kReduceScatter, out1, input(), 0, 0, false);
    if (r == 0) {
      w1->wait();
      at::Tensor scribble = input();  // would take the lent block's place were it freed
      scribble.fill_(std::numeric_limits<float>::quiet_NaN());
      rank0_done = true;
      // 2: the caller keeps its input and overwrites it once its wait returns.
      at::Tensor in2 = input();
      WorkHandle w2 =
          shm.start(Kind::kReduceScatter, kept_out[0] = at::empty({n}), in2, 1, 1, false);
      w2->wait();
      in2.fill_(std::numeric_limits<float>::quiet_NaN());
    } else {
      slow_peer();
      w1->wait();
      WorkHandle w2 =
          shm.start(Kind::kReduceScatter, kept_out[static_cast<size_t>(r)] = at::empty({n}),
                    input(), 1, 1, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      w2->wait();
    }
    dropped_out[static_cast<size_t>(r)] = out1;
  });
  EXPECT_EQ(mail.messages(), 0) << "lent inputs never go over the fallback";
  for (int64_t r = 0; r < kRanks; ++r) {
    const double k = static_cast<double>(r + 1);
    const at::Tensor chunk_sum = rank_data(0, n) * k + rank_data(1, n) * k + rank_data(2, n) * k;
    EXPECT_TRUE(at::equal(dropped_out[static_cast<size_t>(r)], chunk_sum)) << "rank " << r;
    EXPECT_TRUE(at::equal(kept_out[static_cast<size_t>(r)], chunk_sum)) << "rank " << r;
  }
  for (auto& a : arenas) EXPECT_EQ(a->bytes_in_use(), 0u) << "lent blocks are freed once read";
}

TEST(ShmCollectives, OutOfPlaceAllReduceLendsArenaInputsWhereTheyLie) {
  // Tensor parallel's partial sums: reduced into a fresh output, the input lent, not copied
  // (128 KiB inputs, 4 KiB rings: anything not lent would go over the fallback).
  Mailbox mail;
  constexpr int64_t n = 1 << 15;
  std::vector<std::unique_ptr<ShmArena>> arenas;
  for (int64_t r = 0; r < kRanks; ++r)
    arenas.push_back(std::make_unique<ShmArena>(size_t{16} << 20, size_t{64} << 10));
  std::vector<at::Tensor> sums(kRanks), averages(kRanks);
  on_ranks(4096, mail, [&](int64_t r, ShmCollectives& shm) {
    ShmArena& arena = *arenas[static_cast<size_t>(r)];
    auto input = [&] {
      at::Tensor t = at::detail::empty_generic(
          {n}, &arena, c10::DispatchKeySet(c10::DispatchKey::CPU), at::kFloat, std::nullopt);
      t.copy_(rank_data(r, n));
      EXPECT_TRUE(ShmArena::lendable(t).has_value());
      return t;
    };
    // The caller keeps its input and overwrites it once wait() returns; a slow rank 2.
    at::Tensor in = input();
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    WorkHandle w =
        shm.start(Kind::kAllReduce, sums[static_cast<size_t>(r)] = at::empty({n}), in, 0, 0, false);
    w->wait();
    in.fill_(std::numeric_limits<float>::quiet_NaN());
    // The caller lets go of its input once issued (an average this time).
    shm.start(Kind::kAllReduce, averages[static_cast<size_t>(r)] = at::empty({n}), input(), 1, 1,
              true)
        ->wait();
  });
  EXPECT_EQ(mail.messages(), 0) << "lent inputs never go over the fallback";
  const at::Tensor sum = rank_data(0, n) + rank_data(1, n) + rank_data(2, n);
  for (int64_t r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(at::equal(sums[static_cast<size_t>(r)], sum)) << "rank " << r;
    EXPECT_TRUE(at::equal(averages[static_cast<size_t>(r)], sum / 3)) << "rank " << r;
  }
  for (auto& a : arenas) EXPECT_EQ(a->bytes_in_use(), 0u) << "lent blocks are freed once read";
}

TEST(ShmCollectives, AllReduceTakesTpGroupsAndSmallTensorsOnly) {
  Mailbox mail;
  on_ranks(4096, mail, [](int64_t, ShmCollectives& shm) {
    EXPECT_TRUE(shm.takes_all_reduce(64 << 20));  // 3 ranks: every size
    EXPECT_FALSE(shm.takes_all_reduce(0));
  });
}

TEST(ShmSettings, ReadsTheBackendsVariablesAndRejectsABadSize) {
  ::setenv("HYPERPAR_TESTB_SHM", "0", 1);
  ::setenv("HYPERPAR_TESTB_SHM_BYTES", "4096", 1);
  auto s = hyperpar::comm::shm_settings("TESTB");
  EXPECT_FALSE(s.enabled);
  EXPECT_EQ(s.ring_bytes, 4096u);
  ::unsetenv("HYPERPAR_TESTB_SHM");
  ::unsetenv("HYPERPAR_TESTB_SHM_BYTES");
  s = hyperpar::comm::shm_settings("TESTB");
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.ring_bytes, size_t{64} << 20);
  for (const char* bad : {"64MB", "0", "-1", "x"}) {
    ::setenv("HYPERPAR_TESTB_SHM_BYTES", bad, 1);
    try {
      hyperpar::comm::shm_settings("TESTB");
      ADD_FAILURE() << "accepted HYPERPAR_TESTB_SHM_BYTES=" << bad;
    } catch (const hyperpar::Error& e) {
      EXPECT_NE(
          std::string(e.what()).find("HYPERPAR_TESTB_SHM_BYTES must be a positive byte count"),
          std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("HYPERPAR_TESTB_SHM_BYTES");
}
