// Partial(op) -> Replicate: all-reduce with op into a fresh contiguous tensor (the input is
// never modified, and not copied first). 16-bit floats are reduced in float32 and rounded back once
// (MPI has no 16-bit reductions, and the sum is more accurate). Adjoint: identity (the gradient of
// a Replicate value is Replicate).
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
    const bool half = local.scalar_type() == at::kBFloat16 || local.scalar_type() == at::kHalf;
    // The partial input stays as it is (autograd may hold it): reduce into a new tensor
    // rather than cloning it and reducing the clone in place.
    const at::Tensor in = half ? local.to(at::kFloat).contiguous() : local.contiguous();
    at::Tensor out = half ? in : at::empty_like(in, at::MemoryFormat::Contiguous);
    if (out.numel() > 0)
      ctx.group->all_reduce_into(out, in, std::get<Partial>(from).op, {ctx.tag, false});
    return half ? out.to(local.scalar_type()) : out;
  }
};
}  // namespace
const Transition& partial_to_replicate() {
  static const PartialToReplicate t;
  return t;
}
}  // namespace hyperpar::dtensor
