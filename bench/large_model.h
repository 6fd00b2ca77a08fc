#pragma once
// The >= 4 GiB model the memory and checkpoint benchmarks share: a Llama-style dense
// Transformer (dim 4096, 8 layers, vocab 32000: 6.3 GiB of fp32 weights), TP=2 on an even
// world, built on meta.
#include "hyperpar/train/config.h"

namespace hyperpar::bench {

inline train::Config large_model_config(int64_t world_size) {
  train::Config c;
  c.model.vocab_size = 32000;
  c.model.dim = 4096;
  c.model.n_layers = 8;
  c.model.n_heads = 32;
  c.model.n_kv_heads = 8;
  c.model.ffn_hidden = 11008;
  c.parallel.tp = world_size % 2 == 0 ? 2 : 1;
  c.parallel.init_on_meta = true;
  return c;
}

}  // namespace hyperpar::bench
