// Shard(a) -> Shard(b), a != b: one all-to-all. Rank r is sent the block (my piece of a) x
// (r's piece of b) and the received blocks are concatenated along a. Adjoint: the reverse
// all-to-all.
#include "registry_entries.h"
#include "steps.h"

namespace hyperpar::dtensor {
namespace {
class ShardToShard final : public Transition {
 public:
  const char* name() const override { return "shard_to_shard"; }
  bool suitable(const Placement& from, const Placement& to) const override {
    return is_shard(from) && is_shard(to) && shard_dim(from) != shard_dim(to);
  }
  at::Tensor apply(const at::Tensor& local, const Placement& from, const Placement& to,
                   const StepContext& ctx) const override {
    const int64_t a = shard_dim(from), b = shard_dim(to);
    const int64_t ea = ctx.extent(a), eb = ctx.extent(b);
    std::vector<at::Tensor> send_parts;
    std::vector<int64_t> send_split, recv_split;
    std::vector<int64_t> recv_shape(local.sizes().begin(), local.sizes().end());
    const IndexRange my_b = chunk_range(eb, ctx.size, ctx.coord);
    recv_shape[b] = my_b.size;
    int64_t recv_total = 0;
    for (int64_t r = 0; r < ctx.size; ++r) {
      const IndexRange rb = chunk_range(eb, ctx.size, r);
      at::Tensor part = local.narrow(b, rb.start, rb.size).contiguous().reshape({-1});
      send_split.push_back(part.numel());
      send_parts.push_back(part);
      int64_t n = chunk_range(ea, ctx.size, r).size;
      for (size_t d = 0; d < recv_shape.size(); ++d)
        if (static_cast<int64_t>(d) != a) n *= recv_shape[d];
      recv_split.push_back(n);
      recv_total += n;
    }
    at::Tensor send = at::cat(send_parts, 0);
    at::Tensor recv = at::empty({recv_total}, local.options());
    // Every rank of the group sees the same parent block, so all agree on skipping.
    int64_t group_elems = ea * eb;
    for (size_t d = 0; d < recv_shape.size(); ++d)
      if (static_cast<int64_t>(d) != a && static_cast<int64_t>(d) != b)
        group_elems *= recv_shape[d];
    if (group_elems > 0)
      ctx.group->all_to_all_single(recv, send, recv_split, send_split, {ctx.tag, false});
    std::vector<at::Tensor> blocks;
    int64_t off = 0;
    for (int64_t r = 0; r < ctx.size; ++r) {
      std::vector<int64_t> shape = recv_shape;
      shape[a] = chunk_range(ea, ctx.size, r).size;
      blocks.push_back(recv.narrow(0, off, recv_split[r]).view(shape));
      off += recv_split[r];
    }
    return at::cat(blocks, a).contiguous();
  }
};
}  // namespace
const Transition& shard_to_shard() {
  static const ShardToShard t;
  return t;
}
}  // namespace hyperpar::dtensor
