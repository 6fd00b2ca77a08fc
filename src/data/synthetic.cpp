#include "hyperpar/data/synthetic.h"

#include <ATen/ATen.h>

#include "hyperpar/dtensor/random.h"

namespace hyperpar::data {

Batch make_batch(uint64_t seed, int64_t step, int64_t seq_len, int64_t vocab, int64_t first,
                 int64_t count, uint32_t stream) {
  static const int64_t rules[4][2] = {{1, 1}, {3, 7}, {5, 3}, {7, 11}};
  std::vector<int64_t> data;
  data.reserve(count * (seq_len + 1));
  for (int64_t row = first; row < first + count; ++row) {
    const auto r = dtensor::philox4x32_10(
        {static_cast<uint32_t>(row), static_cast<uint32_t>(step), 0x5eedu, stream},
        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    int64_t x = r[0] % vocab;
    const auto& rule = rules[r[1] % 4];
    for (int64_t i = 0; i <= seq_len; ++i) {
      data.push_back(x);
      x = (rule[0] * x + rule[1]) % vocab;
    }
  }
  at::Tensor all =
      at::tensor(data, at::TensorOptions().dtype(at::kLong)).view({count, seq_len + 1});
  return {all.narrow(1, 0, seq_len).contiguous(), all.narrow(1, 1, seq_len).contiguous()};
}

}  // namespace hyperpar::data
