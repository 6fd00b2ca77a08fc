// Replicate -> Partial(op): for sum, coordinate 0 keeps the value and the others hold zeros
// (exact: no division, so Partial -> Replicate gives back the same bits); for avg, max and
// min every rank keeps the value. Adjoint: identity.
#include <ATen/ATen.h>

#include "registry_entries.h"

namespace hyperpar::dtensor {
namespace {
class ReplicateToPartial final : public Transition {
 public:
  const char* name() const override { return "replicate_to_partial"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_replicate(from) && is_partial(to);
  }
  at::Tensor apply(const at::Tensor& local, const Placement&, const Placement& to,
                   const StepContext& ctx) const override {
    if (std::get<Partial>(to).op == comm::ReduceOp::kSum && ctx.coord != 0)
      return at::zeros_like(local, at::MemoryFormat::Contiguous);
    return local.clone(at::MemoryFormat::Contiguous);
  }
};
}  // namespace
const Transition& replicate_to_partial() {
  static const ReplicateToPartial t;
  return t;
}
}  // namespace hyperpar::dtensor
