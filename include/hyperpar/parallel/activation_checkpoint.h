#pragma once
// Activation checkpointing of a Transformer's blocks (parallel.activation_checkpoint),
// torchtitan's options on nn/checkpoint.h:
//   none        every activation is kept
//   full        each block is recomputed in backward from its input (its FSDP unshard and
//               TP/EP communication run again, before the recomputation)
//   every:K     blocks whose layer id is a multiple of K are recomputed (every:1 = full)
//   selective   inside each block, matmul outputs, norm outputs and EP's all-to-all results
//               are kept; rotary + attention (from q, k, v) and SwiGLU (from the two matmul
//               outputs, in every expert too) are recomputed: no communication is repeated,
//               and attention's and SwiGLU's intermediates are not stored
// Losses and gradients are bit-identical to none in every mode. Why norms are kept under
// selective: a norm's input (the residual stream) feeds the norm twice and the residual add
// once; recomputing the norm in a region of its own sums those three gradient terms in
// another order (not bit-identical), and the norm's weight, used inside the region, would
// be invisible to FSDP's reduction of the block (nn/checkpoint.h). Regions here use no
// parameter, or (full, every:K) contain the block's FSDP unshard.
//
//   auto ac = parse_activation_checkpoint("every:2", "parallel.activation_checkpoint");
//   apply_activation_checkpoint(model, ac);   // layers 0, 2, 4, ... recomputed
#include <string>

#include "hyperpar/models/transformer.h"

namespace hyperpar::parallel {

struct ActivationCheckpoint {
  enum class Mode { kNone, kFull, kEvery, kSelective } mode = Mode::kNone;
  int64_t every = 1;  // kEvery: K
  std::string to_string() const;
};

/// Throws UsageError naming `key` and the accepted forms.
ActivationCheckpoint parse_activation_checkpoint(const std::string& text, const std::string& key);

/// Marks the model's blocks (whatever part of the model this rank holds).
void apply_activation_checkpoint(models::Transformer& model, const ActivationCheckpoint& ac);

}  // namespace hyperpar::parallel
