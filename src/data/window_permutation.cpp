#include "hyperpar/data/window_permutation.h"

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/random.h"

namespace hyperpar::data {

WindowPermutation::WindowPermutation(int64_t n, uint64_t seed, int64_t epoch) : n_(n) {
  HP_CHECK(n > 0, "WindowPermutation: n must be positive, got ", n);
  int bits = 2;
  while ((int64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  key_[0] = static_cast<uint32_t>(seed);
  key_[1] = static_cast<uint32_t>(seed >> 32);
  epoch_lo_ = static_cast<uint32_t>(epoch);
  epoch_hi_ = static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32);
}

uint64_t WindowPermutation::round(uint64_t half, int r) const {
  const auto x = dtensor::philox4x32_10(
      {static_cast<uint32_t>(half), static_cast<uint32_t>(half >> 32) ^ 0xda7au, epoch_lo_,
       (epoch_hi_ << 4) | static_cast<uint32_t>(r)},
      {key_[0], key_[1]});
  return ((static_cast<uint64_t>(x[1]) << 32) | x[0]) & half_mask_;
}

int64_t WindowPermutation::operator()(int64_t i) const {
  HP_CHECK(i >= 0 && i < n_, "WindowPermutation: index ", i, " outside [0, ", n_, ")");
  auto v = static_cast<uint64_t>(i);
  do {
    uint64_t left = v >> half_bits_, right = v & half_mask_;
    for (int r = 0; r < 4; ++r) {
      const uint64_t next = left ^ round(right, r);
      left = right;
      right = next;
    }
    v = (left << half_bits_) | right;
  } while (v >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(v);
}

}  // namespace hyperpar::data
