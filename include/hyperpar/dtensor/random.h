#pragma once
// Shard-consistent initialisation with a counter-based RNG (Philox-4x32-10).
//
// Every element's value is a pure function of (seed, stream, global linear index): the
// stream is a hash of the parameter's fully qualified name, the index is the element's
// position in the unsharded tensor. So a rank that initialises only its shard (any
// placements, any mesh) writes exactly the values the unsharded initialisation has there,
// and the gathered model is bit-identical to a single-process init with the same seed.
//
//   InitScheme s = InitScheme::trunc_normal(0.0, 0.02, -0.04, 0.04);
//   init_shard(local, {4096, 4096}, spec.local_ranges(), s, seed, stream_of("layers.0.attention.wq.weight"));
//
// Values are computed in double precision with scalar code and rounded once to the
// tensor's dtype, so they do not depend on vector widths or on how the tensor is split.
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "hyperpar/dtensor/shard_math.h"

namespace hyperpar::dtensor {

struct InitScheme {
  enum class Kind { kZeros, kOnes, kConstant, kUniform, kNormal, kTruncNormal };
  Kind kind = Kind::kZeros;
  double p0 = 0, p1 = 0;  // uniform: low, high; normal: mean, std; constant: value
  double lo = 0, hi = 0;  // truncated normal: absolute bounds [lo, hi]

  static InitScheme zeros() { return {Kind::kZeros}; }
  static InitScheme ones() { return {Kind::kOnes}; }
  static InitScheme constant(double v) { return {Kind::kConstant, v}; }
  static InitScheme uniform(double low, double high) { return {Kind::kUniform, low, high}; }
  static InitScheme normal(double mean, double std) { return {Kind::kNormal, mean, std}; }
  /// torch.nn.init.trunc_normal_(mean, std, a=lo, b=hi): resampled until inside [lo, hi].
  static InitScheme trunc_normal(double mean, double std, double lo, double hi) {
    return {Kind::kTruncNormal, mean, std, lo, hi};
  }
  /// torch.nn.Linear's default for weight and bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  static InitScheme linear_default(int64_t fan_in);
  /// torch.nn.Embedding's default: N(0, 1).
  static InitScheme embedding_default() { return normal(0.0, 1.0); }
  std::string to_string() const;
};

/// Philox-4x32 with 10 rounds (Salmon et al., SC'11).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// Stable 64-bit stream id of a name (FNV-1a).
uint64_t stream_of(const std::string& name);

/// Fills `local` (contiguous, any float dtype, not meta) with the values the unsharded tensor
/// of `global_shape` would hold at `ranges`.
void init_shard(at::Tensor& local, const std::vector<int64_t>& global_shape,
                const std::vector<IndexRanges>& ranges, const InitScheme& scheme, uint64_t seed,
                uint64_t stream);

}  // namespace hyperpar::dtensor
