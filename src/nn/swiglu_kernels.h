#pragma once
// The fused SwiGLU's loops (nn/fused_ops.h), in swiglu_kernels_avx2.cpp: compiled for AVX2+FMA
// with ATen's Vectorized<float> (its exp is Sleef's, as ATen's own silu kernel), so the
// results match at::silu(a) * b. Callers check avx2_fma_available() first. Ranges: elements
// [0, n) of contiguous float arrays.
#include <cstdint>

namespace hyperpar::nn::swiglu_kernels {

bool avx2_fma_available();

/// sig = sigmoid(a) = 1 / (1 + exp(-a)); out = a * sig * b (silu(a) * b).
void forward_avx2(const float* a, const float* b, float* out, float* sig, int64_t n);

/// From the output's gradient g and the forward's sig: da = g * b * sig * (1 + a * (1 - sig)),
/// db = g * a * sig.
void backward_avx2(const float* g, const float* a, const float* b, const float* sig, float* da,
                   float* db, int64_t n);

}  // namespace hyperpar::nn::swiglu_kernels
