// Shard math and placements in one process: torch.chunk ranges, strided shards, N-D local
// ranges, and the value semantics of placements.
#include <gtest/gtest.h>

#include <unordered_set>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/placement.h"
#include "hyperpar/dtensor/shard_math.h"

using namespace hyperpar::dtensor;

TEST(ShardMath, ChunkRangeFollowsTorchChunk) {
  // torch.chunk(arange(10), 4) -> sizes 3,3,3,1
  EXPECT_EQ(chunk_range(10, 4, 0), (IndexRange{0, 3}));
  EXPECT_EQ(chunk_range(10, 4, 3), (IndexRange{9, 1}));
  // torch.chunk(arange(5), 4) -> sizes 2,2,1 and the 4th part is empty
  EXPECT_EQ(chunk_range(5, 4, 2), (IndexRange{4, 1}));
  EXPECT_EQ(chunk_range(5, 4, 3), (IndexRange{5, 0}));
  // 2 rows over 4: parts 2 and 3 are empty
  EXPECT_EQ(chunk_range(2, 4, 1), (IndexRange{1, 1}));
  EXPECT_EQ(chunk_range(2, 4, 3).size, 0);
  EXPECT_EQ(chunk_range(0, 8, 5), (IndexRange{0, 0}));
  EXPECT_EQ(max_chunk_size(10, 4), 3);
  EXPECT_THROW(chunk_range(4, 0, 0), hyperpar::Error);
  EXPECT_THROW(chunk_range(4, 2, 2), hyperpar::Error);
  for (int64_t n = 0; n < 40; ++n)
    for (int64_t k = 1; k < 9; ++k) {
      int64_t next = 0;
      for (int64_t i = 0; i < k; ++i) {
        auto r = chunk_range(n, k, i);
        if (r.size > 0) {
          EXPECT_EQ(r.start, next);
          next += r.size;
        }
      }
      EXPECT_EQ(next, n) << n << " " << k;
    }
}

TEST(ShardMath, SelectPositionsAcrossRanges) {
  IndexRanges r = {{2, 2}, {6, 2}};  // items 2,3,6,7
  EXPECT_EQ(select_positions(r, 1, 2), (IndexRanges{{3, 1}, {6, 1}}));
  EXPECT_EQ(select_positions(r, 0, 4), r);
  EXPECT_TRUE(select_positions(r, 4, 0).empty());
}

TEST(ShardMath, StridedShardMatchesTpThenFsdp) {
  // 8 rows, mesh (dp=2, tp=2), (StridedShard{0,2}, Shard{0}): the doc example.
  Placements p = {StridedShard{0, 2}, Shard{0}};
  auto at = [&](int64_t dp, int64_t tp) { return local_ranges({8, 3}, {2, 2}, {dp, tp}, p)[0]; };
  EXPECT_EQ(at(0, 0), (IndexRanges{{0, 2}}));
  EXPECT_EQ(at(0, 1), (IndexRanges{{4, 2}}));
  EXPECT_EQ(at(1, 0), (IndexRanges{{2, 2}}));
  EXPECT_EQ(at(1, 1), (IndexRanges{{6, 2}}));
  // Same as sharding over tp first and dp inside each tp shard.
  for (int64_t dp = 0; dp < 2; ++dp)
    for (int64_t tp = 0; tp < 2; ++tp) {
      auto tp_first = local_ranges({8, 3}, {2, 2}, {tp, dp}, {Shard{0}, Shard{0}})[0];
      EXPECT_EQ(at(dp, tp), tp_first);
    }
  // Dim 1 untouched.
  EXPECT_EQ(local_ranges({8, 3}, {2, 2}, {1, 1}, p)[1], (IndexRanges{{0, 3}}));
  // Uneven strided: 7 rows, split factor 2 -> pieces of 4 and 3, each over dp=2.
  EXPECT_EQ(held_positions(7, StridedShard{0, 2}, 2, 1), (IndexRanges{{2, 2}, {6, 1}}));
}

TEST(ShardMath, NdLocalShapesCoverTheTensorExactlyOnce) {
  const std::vector<int64_t> shape = {7, 5, 3};
  const std::vector<Placements> layouts = {{Shard{0}, Shard{1}},
                                           {Shard{0}, Shard{0}},
                                           {Replicate{}, Shard{2}},
                                           {StridedShard{0, 3}, Shard{0}},
                                           {Partial{}, Shard{1}}};
  for (const auto& p : layouts) {
    std::vector<int> hits(7 * 5 * 3, 0);
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b) {
        auto lr = local_ranges(shape, {2, 3}, {a, b}, p);
        for (const auto& r0 : lr[0])
          for (int64_t i = r0.start; i < r0.start + r0.size; ++i)
            for (const auto& r1 : lr[1])
              for (int64_t j = r1.start; j < r1.start + r1.size; ++j)
                for (const auto& r2 : lr[2])
                  for (int64_t k = r2.start; k < r2.start + r2.size; ++k)
                    ++hits[(i * 5 + j) * 3 + k];
      }
    // Replicate/Partial dims hold everything on each of their coordinates.
    int expect = 1;
    if (is_replicate(p[0]) || is_partial(p[0])) expect *= 2;
    if (is_replicate(p[1]) || is_partial(p[1])) expect *= 3;
    for (int h : hits) ASSERT_EQ(h, expect) << to_string(p);
  }
  EXPECT_EQ(local_shape(shape, {2, 3}, {1, 2}, {Shard{0}, Shard{1}}),
            (std::vector<int64_t>{3, 1, 3}));
  EXPECT_THROW(local_shape(shape, {2, 3}, {0, 0}, {Shard{3}, Replicate{}}), hyperpar::Error);
}

TEST(Placement, ValueSemantics) {
  EXPECT_EQ(Placement(Shard{1}), Placement(Shard{1}));
  EXPECT_NE(Placement(Shard{1}), Placement(Shard{0}));
  EXPECT_NE(Placement(Shard{0}), Placement(StridedShard{0, 2}));
  EXPECT_NE(Placement(Partial{}), Placement(Partial{hyperpar::comm::ReduceOp::kMax}));
  EXPECT_EQ(to_string(Placements{Shard{0}, Replicate{}, Partial{}, StridedShard{1, 4}}),
            "(Shard(0), Replicate(), Partial(sum), StridedShard(1, sf=4))");
  std::unordered_set<size_t> hashes;
  for (Placement p :
       {Placement(Shard{0}), Placement(Shard{1}), Placement(Replicate{}), Placement(Partial{}),
        Placement(StridedShard{0, 2}), Placement(Partial{hyperpar::comm::ReduceOp::kAvg})})
    hashes.insert(hash_value(p));
  EXPECT_EQ(hashes.size(), 6u);
  EXPECT_EQ(grad_placement_of(Partial{}), Placement(Replicate{}));
  EXPECT_EQ(shard_dim(StridedShard{2, 2}), 2);
  EXPECT_EQ(shard_dim(Replicate{}), -1);
}
