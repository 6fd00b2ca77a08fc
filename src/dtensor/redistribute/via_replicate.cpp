// Pairs with no direct collective (Shard -> Partial, StridedShard <-> Shard, a change of
// StridedShard or of Partial's op, Partial -> ... handled above): two registered steps
// through Replicate on the same mesh dim.
#include "registry_entries.h"

namespace hyperpar::dtensor {
namespace {
class ViaReplicate final : public Transition {
 public:
  const char* name() const override { return "via_replicate"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    if (from == to || is_replicate(from) || is_replicate(to)) return false;
    if (is_partial(from)) return is_partial(to);       // P(a) -> P(b)
    if (is_shard(from) && is_shard(to)) return false;  // all-to-all
    return true;                                       // S/SS -> P, S <-> SS, SS -> SS'
  }
  at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement& to,
                   const StepContext& ctx) const override {
    const Placement r = Replicate{};
    at::Tensor full = find_transition(from, r).apply(local, from, r, ctx);
    return find_transition(r, to).apply(full, r, to, ctx);
  }
};
}  // namespace
const Transition& via_replicate() {
  static const ViaReplicate t;
  return t;
}
}  // namespace hyperpar::dtensor
