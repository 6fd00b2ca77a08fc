#pragma once
// A seeded pseudo-random permutation of [0, n), evaluated one index at a time in O(1) memory:
// a 4-round Feistel network on the smallest even-width bit domain 2^(2h) >= n, keyed by
// (seed, epoch) through Philox, with cycle walking (re-applying the network until the value
// falls inside [0, n); the expected number of walks is below 4). Every epoch is a different
// permutation, so epochs reshuffle and no window repeats within one.
//
//   WindowPermutation p(10, /*seed=*/7, /*epoch=*/0);
//   // p(0), p(1), ..., p(9) is 0..9 in some order; WindowPermutation(10, 7, 1) is another
#include <cstdint>

namespace hyperpar::data {

class WindowPermutation {
 public:
  WindowPermutation(int64_t n, uint64_t seed, int64_t epoch);
  /// The image of i, for 0 <= i < n.
  int64_t operator()(int64_t i) const;
  int64_t size() const { return n_; }

 private:
  uint64_t round(uint64_t half, int r) const;
  int64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint32_t key_[2];
  uint32_t epoch_lo_, epoch_hi_;
};

}  // namespace hyperpar::data
