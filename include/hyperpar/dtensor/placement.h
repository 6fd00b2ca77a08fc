#pragma once
// Placement: how a DTensor's data is laid out along one mesh dim (PyTorch's placement types).
//
//   Shard{0}            tensor dim 0 split over the mesh dim as torch.chunk does
//   StridedShard{0, 2}  tensor dim 0 first cut into 2 pieces (torch.chunk); each piece is then
//                       split over this mesh dim and a rank holds its part of every piece,
//                       concatenated. FSDP uses it on the dp dim when TP/EP shards the same
//                       tensor dim on a mesh dim to its right, with split_factor = that size.
//                       Rows 0..7 on (dp=2, tp=2) with (StridedShard{0,2}, Shard{0}): dp=0
//                       holds {0,1,4,5} before tp splits it, so (dp,tp) = (0,0) holds {0,1},
//                       (0,1) {4,5}, (1,0) {2,3}, (1,1) {6,7}: exactly "TP first, then FSDP
//                       splits each TP shard", which plain (Shard{0}, Shard{0}) is not.
//   Replicate{}         every rank holds the whole tensor
//   Partial{op}         every rank holds a term; the value is their reduction (sum/avg/max/min)
//
// A value type (std::variant): compared with ==, hashed, printed; no class hierarchy.
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "hyperpar/comm/options.h"

namespace hyperpar::dtensor {

struct Shard {
  int64_t dim = 0;
  bool operator==(const Shard& o) const { return dim == o.dim; }
  bool operator!=(const Shard& o) const { return !(*this == o); }
};
struct StridedShard {
  int64_t dim = 0;
  int64_t split_factor = 1;
  bool operator==(const StridedShard& o) const {
    return dim == o.dim && split_factor == o.split_factor;
  }
  bool operator!=(const StridedShard& o) const { return !(*this == o); }
};
struct Replicate {
  bool operator==(const Replicate&) const { return true; }
  bool operator!=(const Replicate& o) const { return !(*this == o); }
};
struct Partial {
  comm::ReduceOp op = comm::ReduceOp::kSum;
  bool operator==(const Partial& o) const { return op == o.op; }
  bool operator!=(const Partial& o) const { return !(*this == o); }
};

using Placement = std::variant<Shard, StridedShard, Replicate, Partial>;
using Placements = std::vector<Placement>;

inline bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
inline bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }
inline bool is_shard(const Placement& p) { return std::holds_alternative<Shard>(p); }
inline bool is_strided_shard(const Placement& p) { return std::holds_alternative<StridedShard>(p); }
/// The tensor dim a Shard or StridedShard splits; -1 for Replicate and Partial.
int64_t shard_dim(const Placement& p);
/// Partial becomes Replicate (the placement a gradient takes for a Partial value).
Placement grad_placement_of(const Placement& p);

std::string to_string(const Placement& p);
std::string to_string(const Placements& ps);
size_t hash_value(const Placement& p);
size_t hash_value(const Placements& ps);

}  // namespace hyperpar::dtensor
