// Replicate -> Shard(d) or StridedShard(d, f): each rank keeps its piece (no communication).
// Adjoint: all-gather.
#include "registry_entries.h"
#include "steps.h"

namespace hyperpar::dtensor {
namespace {
class ReplicateToShard final : public Transition {
 public:
  const char* name() const override { return "replicate_to_shard"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_replicate(from) && (is_shard(to) || is_strided_shard(to));
  }
  at::Tensor apply(const at::Tensor& local, const Placement&, const Placement& to,
                   const StepContext& ctx) const override {
    return steps::take_piece(local, shard_dim(to), to, ctx);
  }
};
}  // namespace
const Transition& replicate_to_shard() {
  static const ReplicateToShard t;
  return t;
}
}  // namespace hyperpar::dtensor
