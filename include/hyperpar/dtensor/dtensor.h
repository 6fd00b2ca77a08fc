#pragma once
// DTensor: a local tensor plus its DTensorSpec (mesh, placements, global shape), with
// PyTorch's DTensor API. Only the local shard is ever allocated.
//
//   auto mesh = DeviceMesh::init(world, {2, 4}, {"dp", "tp"});
//   auto w = DTensor::distribute(full_w, mesh, {Replicate{}, Shard{0}});   // rank keeps its rows
//   at::Tensor full = w.full_tensor();                                     // all-gather on tp
//   auto p = DTensor::from_local(partial_sum, mesh, {Replicate{}, Partial{}});
//   auto r = p.redistribute({Replicate{}, Replicate{}});                  // all-reduce on tp
//
// Autograd: from_local keeps the local tensor's history; redistribute and full_tensor are
// differentiable (see redistribute.h for the gradient layouts).
#include <ATen/core/Tensor.h>

#include <optional>

#include "hyperpar/dtensor/dtensor_spec.h"

namespace hyperpar::dtensor {

class DTensor {
 public:
  /// `local` must have spec.local_shape() on this rank.
  DTensor(at::Tensor local, DTensorSpec spec);

  /// No communication. Without `shape`, the global shape assumes even shards (local size x
  /// mesh dim size on every sharded dim); pass `shape` for uneven ones.
  static DTensor from_local(at::Tensor local, const mesh::DeviceMesh& mesh, Placements placements,
                            std::optional<std::vector<int64_t>> shape = std::nullopt);
  /// Rank `src` (index into mesh.ranks()) broadcasts `full` to the mesh; every rank keeps its
  /// piece. Every rank passes a tensor of the same shape and dtype.
  static DTensor distribute(const at::Tensor& full, const mesh::DeviceMesh& mesh,
                            Placements placements, int64_t src = 0);

  const at::Tensor& to_local() const { return local_; }
  /// The local tensor; its gradient will arrive laid out as `grad_placements` and is
  /// converted to this DTensor's layout (e.g. Partial -> Replicate: an all-reduce).
  at::Tensor to_local(const Placements& grad_placements) const;
  /// The whole tensor on every rank (contiguous), differentiable.
  at::Tensor full_tensor() const;
  DTensor redistribute(const Placements& placements,
                       const std::optional<Placements>& grad_placements = std::nullopt,
                       const std::string& tag = "") const;

  const DTensorSpec& spec() const { return spec_; }
  const mesh::DeviceMesh& mesh() const { return spec_.mesh(); }
  const Placements& placements() const { return spec_.placements(); }
  const std::vector<int64_t>& shape() const { return spec_.shape(); }

 private:
  at::Tensor local_;
  DTensorSpec spec_;
};

/// The sub-block of `full` at `ranges` (one list per dim), as a new contiguous tensor.
at::Tensor take_ranges(const at::Tensor& full, const std::vector<IndexRanges>& ranges);
/// Writes `block` into `full` at `ranges` (the inverse of take_ranges).
void put_ranges(at::Tensor& full, const std::vector<IndexRanges>& ranges, const at::Tensor& block);

}  // namespace hyperpar::dtensor
