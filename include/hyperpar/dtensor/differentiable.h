#pragma once
// differentiable(x, forward, backward): one autograd node around an arbitrary forward (run
// without recording) whose backward is the given function of the output gradient. Every
// communication step of hyperpar (redistribute, TP input/output hooks, EP dispatch) is one of
// these, with the adjoint collective as its backward.
//
//   at::Tensor y = differentiable(x, [&](const at::Tensor& t) { return all_gather(t); },
//                                 [=](const at::Tensor& g) { return reduce_scatter(g); },
//                                 "s_to_r");
#include <ATen/core/Tensor.h>

#include <functional>

namespace hyperpar::dtensor {

using TensorFn = std::function<at::Tensor(const at::Tensor&)>;

/// Returns forward(x); when x requires grad (and grad mode is on), the result's grad_fn
/// calls backward(grad_output) to produce x's gradient (not differentiable twice).
at::Tensor differentiable(const at::Tensor& x, const TensorFn& forward, TensorFn backward,
                          const char* name);

}  // namespace hyperpar::dtensor
