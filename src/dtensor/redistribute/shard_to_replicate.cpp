// Shard(d) -> Replicate: all-gather of the pieces along d (padded to the longest piece, as
// torch.chunk leaves them uneven). Adjoint: reduce-scatter (Partial -> Shard).
#include "registry_entries.h"
#include "steps.h"

namespace hyperpar::dtensor {
namespace {
class ShardToReplicate final : public Transition {
 public:
  const char* name() const override { return "shard_to_replicate"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_shard(from) && is_replicate(to);
  }
  at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement&,
                   const StepContext& ctx) const override {
    return steps::gather_pieces(local, shard_dim(from), from, ctx);
  }
};
}  // namespace
const Transition& shard_to_replicate() {
  static const ShardToReplicate t;
  return t;
}
}  // namespace hyperpar::dtensor
