#pragma once
// Fused CPU kernels for the transformer's pointwise work. Composed of ATen ops, RMSNorm is
// pow, mean, add, rsqrt, mul, mul forward and about ten kernels backward, each a full pass
// over the activation (4 MiB for 16 x 128 x 512 floats) and a temporary; rotary is four muls,
// an add, a sub and a stack each way. Here each is one pass forward and one backward, with
// autograd through a custom Function, saving only what the backward reads.
//
// Only float32 CPU tensors take the fused path (the peer benchmark's and the tests'
// dtype); others (bf16 params, meta tensors in dry runs) take the same formula as ATen ops.
// Results agree with the composite ops to float32 rounding (FMA contraction and sum order
// differ): tests/nn/test_fused_ops.cpp holds both to 1e-6 and checks the gradients.
//
//   at::Tensor y = nn::rms_norm(x, weight, 1e-5);     // x [..., D], weight [D]
//   at::Tensor q = nn::rotary(x, cos, sin);           // x [B, S, H, hd], cos/sin [S, hd/2]
//   at::Tensor h = nn::swiglu(w1(x), w3(x));          // then w2(h)
#include <ATen/ATen.h>

namespace hyperpar::nn {

/// y = x / sqrt(mean(x^2 over the last dim) + eps) * weight. Fused: one pass per row forward
/// (saving x and one 1/rms per row), one backward; the weight's gradient is summed over fixed
/// blocks of rows and the blocks added in order, so it does not depend on the thread count.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// Rotary position embedding on interleaved pairs: for x [B, S, H, hd] and tables
/// cos, sin [S, hd/2] (angle of pair i at position s), pair (x[2i], x[2i+1]) becomes
/// (x[2i] cos - x[2i+1] sin, x[2i] sin + x[2i+1] cos). The backward rotates the gradient back
/// (by the negative angle).
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// SwiGLU's gate: silu(a) * b for a, b of one shape (the w1 and w3 projections), silu(x) =
/// x / (1 + exp(-x)). Fused on float32 CPU tensors where the CPU has AVX2 and FMA: one
/// vectorised pass forward (ATen's exp) that keeps sigmoid(a) for the backward, one backward
/// pass producing both gradients without exp or division; else the composite ATen ops.
at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b);

}  // namespace hyperpar::nn
