#pragma once
// Parameter: one named weight of an nn::Module. Holds the local tensor (a leaf that
// requires grad), its global shape, its init scheme and, once a parallel style distributed
// it, its DTensorSpec. Created through make_parameter, which honours the ambient
// DeviceContext: under DeviceContext(meta) nothing is allocated.
//
// value() is what a module's forward uses. It is the local tensor unless a parallel layer
// installed a `materialize` function (FSDP: the unsharded view; sequence parallel: the
// weight wrapped so that its partial gradient is all-reduced).
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "hyperpar/dtensor/dtensor_spec.h"
#include "hyperpar/dtensor/random.h"

namespace hyperpar::nn {

struct Parameter {
  at::Tensor data;             // local shard (or the whole tensor when not distributed)
  std::vector<int64_t> shape;  // global shape
  dtensor::InitScheme init;
  std::optional<dtensor::DTensorSpec> spec;
  std::function<at::Tensor(const at::Tensor&)> materialize;
  bool fsdp_managed = false;  // claimed by a fully_shard group

  bool is_distributed() const { return spec.has_value(); }
  at::Tensor value() const { return materialize ? materialize(data) : data; }
  /// Global index ranges of the local data (the whole tensor when not distributed).
  std::vector<dtensor::IndexRanges> local_ranges() const;
  std::string placements_string() const;
};

/// A parameter of `shape` on the ambient device (zeros on a real device, unallocated on meta).
Parameter make_parameter(std::vector<int64_t> shape, dtensor::InitScheme init,
                         c10::ScalarType dtype = c10::kFloat);

/// Distributes a parameter that is not yet distributed: keeps this rank's block of
/// `placements` on `mesh` (no communication: every rank holds the same full value, as after
/// a seeded init, or it is on meta and only the local shape changes).
void distribute_parameter(Parameter& p, const mesh::DeviceMesh& mesh,
                          const dtensor::Placements& placements);

}  // namespace hyperpar::nn
