#include "hyperpar/dtensor/random.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <sstream>

#include "hyperpar/core/error.h"

namespace hyperpar::dtensor {
namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
constexpr double kTwoPi = 6.283185307179586476925286766559;

// Uniform in (0, 1), never 0 or 1 (log and Box-Muller stay finite).
double to_unit(uint32_t x) { return (static_cast<double>(x) + 0.5) * (1.0 / 4294967296.0); }

struct ElementRng {
  std::array<uint32_t, 2> key;
  uint64_t stream;
  std::array<uint32_t, 4> draw(uint64_t index, uint32_t attempt) const {
    return philox4x32_10(
        {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
         static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32) ^ (attempt * kW0)},
        key);
  }
};

double sample(const InitScheme& s, const ElementRng& rng, uint64_t index) {
  using K = InitScheme::Kind;
  switch (s.kind) {
    case K::kZeros:
      return 0.0;
    case K::kOnes:
      return 1.0;
    case K::kConstant:
      return s.p0;
    case K::kUniform:
      return s.p0 + (s.p1 - s.p0) * to_unit(rng.draw(index, 0)[0]);
    case K::kNormal: {
      auto x = rng.draw(index, 0);
      return s.p0 +
             s.p1 * std::sqrt(-2.0 * std::log(to_unit(x[0]))) * std::cos(kTwoPi * to_unit(x[1]));
    }
    case K::kTruncNormal: {
      for (uint32_t attempt = 0; attempt < 64; ++attempt) {
        auto x = rng.draw(index, attempt);
        for (int pair = 0; pair < 2; ++pair) {
          const double r = std::sqrt(-2.0 * std::log(to_unit(x[2 * pair])));
          const double v = s.p0 + s.p1 * r * std::cos(kTwoPi * to_unit(x[2 * pair + 1]));
          if (v >= s.lo && v <= s.hi) return v;
        }
      }
      return std::min(std::max(s.p0, s.lo), s.hi);  // 256 misses: only for absurd bounds
    }
  }
  return 0.0;
}
}  // namespace

InitScheme InitScheme::linear_default(int64_t fan_in) {
  const double b = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  return uniform(-b, b);
}

std::string InitScheme::to_string() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::kZeros:
      os << "zeros";
      break;
    case Kind::kOnes:
      os << "ones";
      break;
    case Kind::kConstant:
      os << "constant(" << p0 << ")";
      break;
    case Kind::kUniform:
      os << "uniform(" << p0 << ", " << p1 << ")";
      break;
    case Kind::kNormal:
      os << "normal(" << p0 << ", " << p1 << ")";
      break;
    case Kind::kTruncNormal:
      os << "trunc_normal(" << p0 << ", " << p1 << ", [" << lo << ", " << hi << "])";
      break;
  }
  return os.str();
}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint64_t stream_of(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

void init_shard(at::Tensor& local, const std::vector<int64_t>& global_shape,
                const std::vector<IndexRanges>& ranges, const InitScheme& scheme, uint64_t seed,
                uint64_t stream) {
  HP_CHECK(!local.is_meta(), "init_shard: the tensor is on meta; call to_empty first");
  HP_CHECK(local.is_contiguous(), "init_shard: the local tensor must be contiguous");
  HP_CHECK(ranges.size() == global_shape.size(), "init_shard: ", ranges.size(),
           " range lists for a ", global_shape.size(), "-D global shape");
  const size_t nd = global_shape.size();
  std::vector<std::vector<int64_t>> idx(nd);
  int64_t count = 1;
  for (size_t d = 0; d < nd; ++d) {
    for (const auto& r : ranges[d])
      for (int64_t i = r.start; i < r.start + r.size; ++i) idx[d].push_back(i);
    HP_CHECK(static_cast<int64_t>(idx[d].size()) == local.size(d), "init_shard: local dim ", d,
             " has ", local.size(d), " items but its ranges hold ", idx[d].size());
    count *= static_cast<int64_t>(idx[d].size());
  }
  std::vector<int64_t> gstride(nd, 1);
  for (size_t d = nd; d-- > 1;) gstride[d - 1] = gstride[d] * global_shape[d];
  // Values are made in double precision in bounded chunks (so a shard never needs a full
  // double copy of itself) and rounded once into the tensor.
  constexpr int64_t kChunk = int64_t{1} << 18;
  at::Tensor values = at::empty({std::min(count, kChunk)}, at::TensorOptions().dtype(at::kDouble));
  double* out = values.data_ptr<double>();
  const ElementRng rng{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}, stream};
  std::vector<size_t> pos(nd, 0);
  at::NoGradGuard no_grad;
  at::Tensor flat = local.view({-1});
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    for (int64_t e = 0; e < n; ++e) {
      uint64_t g = 0;
      for (size_t d = 0; d < nd; ++d) g += static_cast<uint64_t>(idx[d][pos[d]] * gstride[d]);
      out[e] = sample(scheme, rng, g);
      for (size_t d = nd; d-- > 0;) {
        if (++pos[d] < idx[d].size()) break;
        pos[d] = 0;
      }
    }
    flat.narrow(0, begin, n).copy_(values.narrow(0, 0, n));
  }
}

}  // namespace hyperpar::dtensor
