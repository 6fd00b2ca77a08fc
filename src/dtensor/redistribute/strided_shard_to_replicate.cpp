// StridedShard(d, f) -> Replicate: all-gather of the pieces, then every rank's items are put
// back at their strided positions (one index_select).
#include "registry_entries.h"
#include "steps.h"

namespace hyperpar::dtensor {
namespace {
class StridedShardToReplicate final : public Transition {
 public:
  const char* name() const override { return "strided_shard_to_replicate"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_strided_shard(from) && is_replicate(to);
  }
  at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement&,
                   const StepContext& ctx) const override {
    return steps::gather_pieces(local, shard_dim(from), from, ctx);
  }
};
}  // namespace
const Transition& strided_shard_to_replicate() {
  static const StridedShardToReplicate t;
  return t;
}
}  // namespace hyperpar::dtensor
