#pragma once
// Deterministic, learnable synthetic data: every sequence follows x[i+1] = (a x[i] + b) mod V
// from a seeded start token, with (a, b) one of a few fixed rules chosen per sequence, so a
// model can drive the loss well below log(V). The global batch of a step depends only on
// (seed, step), whatever the layout; a data-parallel rank takes its rows.
#include <cstdint>

#include "hyperpar/data/batch.h"

namespace hyperpar::data {

/// Rows [first, first + count) of the global batch of `step`. `stream` separates independent
/// sequences of batches under one seed (0: training, 1: validation).
Batch make_batch(uint64_t seed, int64_t step, int64_t seq_len, int64_t vocab, int64_t first,
                 int64_t count, uint32_t stream = 0);

}  // namespace hyperpar::data
