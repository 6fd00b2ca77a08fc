// Partial(op) -> Replicate: all-reduce with op on a fresh contiguous copy (the input is never
// modified). Adjoint: identity (the gradient of a Replicate value is Replicate).
#include <ATen/ATen.h>

#include "registry_entries.h"

namespace hyperpar::dtensor {
namespace {
class PartialToReplicate final : public Transition {
 public:
  const char* name() const override { return "partial_to_replicate"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_partial(from) && is_replicate(to);
  }
  at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement&,
                   const StepContext& ctx) const override {
    at::Tensor out = local.clone(at::MemoryFormat::Contiguous);
    if (out.numel() > 0) ctx.group->all_reduce(out, std::get<Partial>(from).op, {ctx.tag, false});
    return out;
  }
};
}  // namespace
const Transition& partial_to_replicate() {
  static const PartialToReplicate t;
  return t;
}
}  // namespace hyperpar::dtensor
