#pragma once
// Contract checks run before any collective is enqueued (DESIGN.md invariant 2): every
// buffer is materialised (not meta, defined), contiguous, of the expected dtype and
// device, and sized consistently with the group. A violation throws ContractError naming
// the collective, the group (mesh dims and ranks), the tensor's shape/strides/dtype/device
// and the caller's tag. The layer never "fixes" a bad buffer (no hidden .contiguous()).
//
//   CallSite site{"all_reduce", "mesh dim tp ranks [4, 5, 6, 7]", "layers.0.wq.weight"};
//   check_buffer(site, "input", t, c10::kFloat, c10::kCPU);  // throws if t = x.t()
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace hyperpar::comm {

struct CallSite {
  std::string op;     // collective name, e.g. "reduce_scatter_tensor"
  std::string group;  // readable group label: mesh dims and ranks
  std::string tag;    // caller's tag (may be empty)
};

/// "shape [4, 8] strides [1, 4] dtype Float device cpu" (or "undefined tensor").
std::string describe_tensor(const at::Tensor& t);

/// Throws ContractError built from the call site and `problem`.
[[noreturn]] void fail_contract(const CallSite& site, const std::string& problem);

/// Checks one buffer. `dtype` unset: any dtype.
void check_buffer(const CallSite& site, const char* role, const at::Tensor& t,
                  std::optional<c10::ScalarType> dtype, c10::DeviceType device);

/// Checks that `a` and `b` share a dtype.
void check_same_dtype(const CallSite& site, const at::Tensor& a, const at::Tensor& b);

/// Checks numel(big) == factor * numel(small), e.g. all-gather output = size x input.
void check_numel_ratio(const CallSite& site, const char* big_role, const at::Tensor& big,
                       const char* small_role, const at::Tensor& small, int64_t factor);

}  // namespace hyperpar::comm
