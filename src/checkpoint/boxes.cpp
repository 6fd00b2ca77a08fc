#include "hyperpar/checkpoint/boxes.h"

#include <algorithm>

namespace hyperpar::checkpoint {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::vector<Box> boxes_of(const std::vector<dtensor::IndexRanges>& ranges) {
  std::vector<Box> out;
  const size_t nd = ranges.size();
  for (const auto& r : ranges)
    if (r.empty()) return out;
  std::vector<size_t> pick(nd, 0);
  while (true) {
    Box b;
    bool empty = false;
    for (size_t d = 0; d < nd; ++d) {
      const auto& rd = ranges[d];
      int64_t local = 0;
      for (size_t i = 0; i < pick[d]; ++i) local += rd[i].size;
      b.offsets.push_back(rd[pick[d]].start);
      b.sizes.push_back(rd[pick[d]].size);
      b.local_offsets.push_back(local);
      empty |= rd[pick[d]].size == 0;
    }
    if (!empty) out.push_back(b);
    size_t d = nd;
    while (d > 0) {
      --d;
      if (++pick[d] < ranges[d].size()) break;
      pick[d] = 0;
      if (d == 0) return out;
    }
    if (nd == 0) return out;
  }
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box o;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    o.offsets.push_back(lo);
    o.sizes.push_back(hi - lo);
  }
  return o;
}

bool writes_replica(const std::optional<dtensor::DTensorSpec>& spec, int64_t global_rank) {
  if (!spec) return global_rank == 0;
  const auto coord = spec->coordinate();
  const auto& pl = spec->placements();
  for (size_t d = 0; d < pl.size(); ++d)
    if (dtensor::shard_dim(pl[d]) < 0 && coord[d] != 0) return false;
  return true;
}

}  // namespace hyperpar::checkpoint
