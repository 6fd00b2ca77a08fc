// Partial(op) -> Shard(d) or StridedShard(d, f): reduce-scatter of the padded pieces along d.
// Adjoint: all-gather.
#include "registry_entries.h"
#include "steps.h"

namespace hyperpar::dtensor {
namespace {
class PartialToShard final : public Transition {
 public:
  const char* name() const override { return "partial_to_shard"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_partial(from) && (is_shard(to) || is_strided_shard(to));
  }
  at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement& to,
                   const StepContext& ctx) const override {
    return steps::reduce_scatter_pieces(local, shard_dim(to), to, std::get<Partial>(from).op, ctx);
  }
};
}  // namespace
const Transition& partial_to_shard() {
  static const PartialToShard t;
  return t;
}
}  // namespace hyperpar::dtensor
