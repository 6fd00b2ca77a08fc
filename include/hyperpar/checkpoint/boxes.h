#pragma once
// A rank's local shard as boxes of the global tensor (PyTorch DCP's "chunks"): pure integer
// math over the per-dim index ranges of dtensor/shard_math.h.
//
// The local tensor holds, along each dim d, the concatenation of ranges[d]; every choice of
// one range per dim is one box: global offsets/sizes, and where it sits in the local tensor.
//   ranges {[2,4)+[6,8)} x {[0,6)}  (8x6 tensor, StridedShard rows)  ->
//     box {offsets [2,0], sizes [2,6], local [0,0]},  box {offsets [6,0], sizes [2,6], local [2,0]}
// Empty boxes (a short torch.chunk part) are dropped.
#include <cstdint>
#include <optional>
#include <vector>

#include "hyperpar/dtensor/dtensor_spec.h"
#include "hyperpar/dtensor/shard_math.h"

namespace hyperpar::checkpoint {

struct Box {
  std::vector<int64_t> offsets;  // in the global tensor
  std::vector<int64_t> sizes;
  std::vector<int64_t> local_offsets;  // in the local tensor
  int64_t numel() const;
};

std::vector<Box> boxes_of(const std::vector<dtensor::IndexRanges>& ranges);

/// The overlap of two boxes (global offsets/sizes; local_offsets unset), if not empty.
std::optional<Box> intersect(const Box& a, const Box& b);

/// Whether the calling rank writes its boxes: replicas are written once, by the rank whose
/// coordinate is 0 on every mesh dim that does not shard the tensor. Undistributed: rank 0.
bool writes_replica(const std::optional<dtensor::DTensorSpec>& spec, int64_t global_rank);

}  // namespace hyperpar::checkpoint
