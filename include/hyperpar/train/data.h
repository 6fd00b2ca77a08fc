#pragma once
// Deterministic, learnable synthetic data: every sequence follows x[i+1] = (a x[i] + b) mod V
// from a seeded start token, with (a, b) one of a few fixed rules chosen per sequence, so a
// model can drive the loss well below log(V). The global batch of a step depends only on
// (seed, step), whatever the layout; a data-parallel rank takes its rows.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyperpar::train {

struct Batch {
  at::Tensor tokens;   // [B, S] int64
  at::Tensor targets;  // [B, S] int64, tokens shifted by one
};

/// Rows [first, first + count) of the global batch of `step`.
Batch make_batch(uint64_t seed, int64_t step, int64_t global_batch, int64_t seq_len, int64_t vocab,
                 int64_t first, int64_t count);

}  // namespace hyperpar::train
