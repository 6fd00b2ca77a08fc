#pragma once
// Linear projections of one input (attention's wq, wk, wv; the feed-forward's w1, w3), with
// one autograd node for all of them.
//
// Autograd gives each projection its own node: each computes its input gradient into a new
// tensor and the engine adds them, a full pass over the input's gradient per extra
// projection (per layer 2 for wq/wk/wv and 1 for w1/w3, over [tokens, dim]). Here the
// backward accumulates them inside the GEMMs (dx = g_q Wq, then dx += g_k Wk with beta 1,
// ...); each weight's gradient is one GEMM into a contiguous [out, in], as autograd's is.
// Forward is the same ATen matmul per weight, so outputs are bitwise those of separate Linear
// calls; gradients agree to float32 rounding (accumulation order):
// tests/nn/test_shared_input_linear.cpp.
//
//   auto y = nn::linears_on_shared_input(x, {wq, wk, wv});  // y[i] = x @ w[i]^T
//   auto out = nn::call_linears_on_shared_input({wq_mod, wk_mod, wv_mod}, x);  // with hooks
#include <ATen/ATen.h>

#include <vector>

namespace hyperpar::nn {

class Linear;

/// y[i] = x @ weights[i]^T for x [..., in] and weights[i] [out_i, in], one autograd node.
std::vector<at::Tensor> linears_on_shared_input(const at::Tensor& x,
                                                const std::vector<at::Tensor>& weights);

/// The modules' calls on one input, as `(*m)(x)` each would give (forward hooks and all),
/// through linears_on_shared_input where that is the same computation: every module is a
/// plain Linear (not a subclass) without a bias, forward pre-hook, output reduction
/// (row-parallel) or whole-module checkpointing.
/// Otherwise each module is called in turn.
std::vector<at::Tensor> call_linears_on_shared_input(const std::vector<Linear*>& modules,
                                                     const at::Tensor& x);

}  // namespace hyperpar::nn
