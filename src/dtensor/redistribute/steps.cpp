#include "steps.h"

#include <algorithm>

namespace hyperpar::dtensor::steps {

at::Tensor rows_at(const at::Tensor& t, const IndexRanges& ranges) {
  if (ranges.size() == 1) return t.narrow(0, ranges[0].start, ranges[0].size);
  std::vector<at::Tensor> parts;
  for (const auto& r : ranges) parts.push_back(t.narrow(0, r.start, r.size));
  if (parts.empty()) return t.narrow(0, 0, 0);
  return at::cat(parts, 0);
}

namespace {
std::vector<IndexRanges> pieces_of_all(int64_t extent, const Placement& held, int64_t k) {
  std::vector<IndexRanges> out;
  for (int64_t r = 0; r < k; ++r) out.push_back(held_positions(extent, held, k, r));
  return out;
}
int64_t max_piece(const std::vector<IndexRanges>& pieces) {
  int64_t m = 0;
  for (const auto& p : pieces) m = std::max(m, total_size(p));
  return m;
}
}  // namespace

at::Tensor gather_pieces(const at::Tensor& local, int64_t dim, const Placement& held,
                         const StepContext& ctx) {
  const int64_t extent = ctx.extent(dim);
  const auto pieces = pieces_of_all(extent, held, ctx.size);
  const int64_t maxlen = max_piece(pieces);
  at::Tensor x = local.movedim(dim, 0);
  std::vector<int64_t> buf_shape(x.sizes().begin(), x.sizes().end());
  buf_shape[0] = maxlen;
  // Own piece, padded to the longest piece, in a fresh contiguous buffer.
  at::Tensor send = at::zeros(buf_shape, x.options());
  if (x.size(0) > 0) send.narrow(0, 0, x.size(0)).copy_(x);
  buf_shape[0] = maxlen * ctx.size;
  at::Tensor recv = at::empty(buf_shape, x.options());
  if (recv.numel() > 0) ctx.group->all_gather_into_tensor(recv, send, {ctx.tag, false});
  // Row of the parent at every position: rank r's j-th held item sits at r*maxlen + j.
  std::vector<int64_t> row_of(extent, 0);
  for (int64_t r = 0; r < ctx.size; ++r) {
    int64_t j = 0;
    for (const auto& rg : pieces[r])
      for (int64_t p = rg.start; p < rg.start + rg.size; ++p) row_of[p] = r * maxlen + j++;
  }
  at::Tensor index = at::tensor(row_of, at::TensorOptions().dtype(at::kLong));
  return recv.index_select(0, index).movedim(0, dim).contiguous();
}

at::Tensor take_piece(const at::Tensor& parent, int64_t dim, const Placement& held,
                      const StepContext& ctx) {
  const auto mine = held_positions(parent.size(dim), held, ctx.size, ctx.coord);
  return rows_at(parent.movedim(dim, 0), mine).movedim(0, dim).contiguous();
}

at::Tensor reduce_scatter_pieces(const at::Tensor& partial_in, int64_t dim, const Placement& held,
                                 comm::ReduceOp op, const StepContext& ctx) {
  // 16-bit floats reduce in float32 and round back once (as partial_to_replicate).
  const bool half =
      partial_in.scalar_type() == at::kBFloat16 || partial_in.scalar_type() == at::kHalf;
  if (half)
    return reduce_scatter_pieces(partial_in.to(at::kFloat), dim, held, op, ctx)
        .to(partial_in.scalar_type());
  const at::Tensor& partial = partial_in;
  const int64_t extent = partial.size(dim);
  const auto pieces = pieces_of_all(extent, held, ctx.size);
  const int64_t maxlen = max_piece(pieces);
  at::Tensor x = partial.movedim(dim, 0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[0] = maxlen * ctx.size;
  at::Tensor send = at::zeros(shape, x.options());
  for (int64_t r = 0; r < ctx.size; ++r) {
    const int64_t len = total_size(pieces[r]);
    if (len > 0) send.narrow(0, r * maxlen, len).copy_(rows_at(x, pieces[r]));
  }
  shape[0] = maxlen;
  at::Tensor recv = at::empty(shape, x.options());
  if (recv.numel() > 0) ctx.group->reduce_scatter_tensor(recv, send, op, {ctx.tag, false});
  const int64_t mine = total_size(pieces[ctx.coord]);
  return recv.narrow(0, 0, mine).movedim(0, dim).contiguous();
}

}  // namespace hyperpar::dtensor::steps
