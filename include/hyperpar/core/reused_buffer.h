#pragma once
// ReusedBuffer: one allocation handed out again and again for results of varying size, such
// as an all-to-all's receive rows (their count changes with the routing every step). take()
// returns a view of the first elements; the storage grows, with a quarter of headroom, only
// when a request is larger than it.
//
// The next take() overwrites what the last one returned, so a result taken from here must be
// consumed (copied) before the buffer is asked again and must not be kept, e.g. by autograd
// saving it for backward. Example: expert parallel receives the dispatched tokens here and
// index_selects them into expert order at once (index_select saves only its index).
//
//   ReusedBuffer rows;
//   at::Tensor got = rows.take({n, dim}, x.options());   // step 1: allocates (n + n/4) * dim
//   at::Tensor next = rows.take({m, dim}, x.options());  // m <= 1.25 n: same storage
#include <ATen/ATen.h>

#include <cstdint>

namespace hyperpar {

class ReusedBuffer {
 public:
  /// A contiguous tensor of `shape` and `options`' dtype and device, in this buffer's storage.
  at::Tensor take(at::IntArrayRef shape, const at::TensorOptions& options);
  int64_t takes() const { return takes_; }
  int64_t allocations() const { return allocations_; }

 private:
  at::Tensor storage_;
  int64_t takes_ = 0, allocations_ = 0;
};

}  // namespace hyperpar
