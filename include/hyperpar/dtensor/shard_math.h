#pragma once
// Shard math: pure integer functions (no tensors, no communication), DESIGN.md invariant 1.
//
// Uneven shards follow torch.chunk: n items in k parts have chunk size c = ceil(n / k); part
// i holds [i*c, min((i+1)*c, n)), so trailing parts may be short or empty:
//   chunk_range(10, 4, i) -> {0,3} {3,3} {6,3} {9,1};  chunk_range(2, 4, 3) -> {2,0}
//
// The items a rank holds along one tensor dim are a list of global index ranges, built by
// applying the placements mesh dim by mesh dim (left to right) to the list the earlier mesh
// dims left:
//   Shard(d) on a mesh dim of size k, coordinate i: part i of the current list
//   StridedShard(d, f): cut the current list into f parts (torch.chunk), take part i of each
//                       part, concatenate
// Example: 8 rows, mesh (2,2), (StridedShard{0,2}, Shard{0}), rank (1,0): after dim 0 the
// list is [2,4) + [6,8), after dim 1 it is [2,4).
#include <cstdint>
#include <vector>

#include "hyperpar/dtensor/placement.h"

namespace hyperpar::dtensor {

struct IndexRange {
  int64_t start;
  int64_t size;
  bool operator==(const IndexRange& o) const { return start == o.start && size == o.size; }
};
using IndexRanges = std::vector<IndexRange>;

/// Part `index` of `n` items split into `parts` as torch.chunk does.
IndexRange chunk_range(int64_t n, int64_t parts, int64_t index);
/// Largest part size of chunk_range(n, parts, *).
int64_t max_chunk_size(int64_t n, int64_t parts);
/// Total number of items in `ranges`.
int64_t total_size(const IndexRanges& ranges);
/// Positions [start, start+size) of the concatenated list `ranges`, as global ranges.
IndexRanges select_positions(const IndexRanges& ranges, int64_t start, int64_t size);
/// Positions (into a list of n items) that coordinate `coord` of a mesh dim of size `k`
/// holds under a Shard or StridedShard placement.
IndexRanges held_positions(int64_t n, const Placement& p, int64_t k, int64_t coord);

/// Global index ranges per tensor dim held at mesh coordinate `coord`.
std::vector<IndexRanges> local_ranges(const std::vector<int64_t>& global_shape,
                                      const std::vector<int64_t>& mesh_shape,
                                      const std::vector<int64_t>& coord,
                                      const Placements& placements);
/// Local shape at `coord` (sizes of local_ranges).
std::vector<int64_t> local_shape(const std::vector<int64_t>& global_shape,
                                 const std::vector<int64_t>& mesh_shape,
                                 const std::vector<int64_t>& coord, const Placements& placements);

}  // namespace hyperpar::dtensor
