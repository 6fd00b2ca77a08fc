#pragma once
// redistribute_local: moves a local shard from one layout to another on the same mesh,
// differentiably. The gradient convention is PyTorch's: the gradient arriving for the
// output is laid out as `grad_placements` (default: the target placements with Partial
// replaced by Replicate), and it leaves laid out as the source placements with Partial
// replaced by Replicate. So, on one mesh dim:
//   forward               backward (default)          backward with grad_placements = Partial
//   S -> R  all-gather    R -> S  local chunk          P -> S  reduce-scatter
//   P -> R  all-reduce    R -> R  identity
//   P -> S  reduce-scatter S -> R all-gather
//   S -> S' all-to-all    S' -> S all-to-all
//   R -> R  identity      R -> R  identity             P -> R  all-reduce  (Megatron's "f")
// A meta local tensor gives a meta result of the target local shape (no communication).
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "hyperpar/dtensor/dtensor_spec.h"

namespace hyperpar::dtensor {

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src,
                              const Placements& dst,
                              const std::optional<Placements>& grad_placements = std::nullopt,
                              const std::string& tag = "");

/// Placements with every Partial replaced by Replicate.
Placements normalized_for_grad(const Placements& p);

}  // namespace hyperpar::dtensor
