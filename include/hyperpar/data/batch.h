#pragma once
// One batch of next-token samples: rows of tokens and their targets (the tokens shifted by
// one), both [rows, seq_len] int64 on the CPU.
#include <ATen/core/Tensor.h>

namespace hyperpar::data {

struct Batch {
  at::Tensor tokens;   // [B, S] int64
  at::Tensor targets;  // [B, S] int64, tokens shifted by one
};

}  // namespace hyperpar::data
