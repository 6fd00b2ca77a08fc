#include "hyperpar/comm/gather_strings.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace hyperpar::comm {

std::vector<std::string> gather_strings(Communicator& group, const std::string& mine) {
  const int64_t size = group.size();
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  at::Tensor lens = at::empty({size}, at::kLong);
  group.all_gather_into_tensor(lens, len, {"gather_strings sizes"});
  const int64_t longest = std::max<int64_t>(1, lens.max().item<int64_t>());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<uint8_t>());
  at::Tensor all = at::empty({size * longest}, at::kByte);
  group.all_gather_into_tensor(all, padded, {"gather_strings"});
  if (group.rank() != 0) return {};
  std::vector<std::string> out;
  const char* base = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  const int64_t* n = lens.data_ptr<int64_t>();
  for (int64_t r = 0; r < size; ++r) out.emplace_back(base + r * longest, n[r]);
  return out;
}

}  // namespace hyperpar::comm
