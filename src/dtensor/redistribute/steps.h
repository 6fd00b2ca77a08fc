#pragma once
// Internal building blocks shared by the transitions: moving the pieces that the ranks of
// one mesh dim hold along a tensor dim (Shard or StridedShard) in and out of padded,
// contiguous collective buffers.
#include <ATen/ATen.h>

#include "hyperpar/dtensor/redistribute/transition.h"
#include "hyperpar/dtensor/shard_math.h"

namespace hyperpar::dtensor::steps {

/// The parent block along `dim` (R on this mesh dim) from every rank's piece (all-gather).
at::Tensor gather_pieces(const at::Tensor& local, int64_t dim, const Placement& held,
                         const StepContext& ctx);
/// The calling rank's piece of a parent block along `dim` (local, no communication).
at::Tensor take_piece(const at::Tensor& parent, int64_t dim, const Placement& held,
                      const StepContext& ctx);
/// Reduce-scatter of a Partial parent block: rank r receives the reduction of piece r.
at::Tensor reduce_scatter_pieces(const at::Tensor& partial, int64_t dim, const Placement& held,
                                 comm::ReduceOp op, const StepContext& ctx);
/// Rows of `t` (dim 0) at the given ranges, concatenated.
at::Tensor rows_at(const at::Tensor& t, const IndexRanges& ranges);

}  // namespace hyperpar::dtensor::steps
