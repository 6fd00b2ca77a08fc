#pragma once
// Activation checkpointing (PyTorch's reentrant torch.utils.checkpoint): checkpoint(fn, xs)
// runs fn without recording its graph and saves only its inputs; when backward reaches it,
// fn runs again with autograd on (a recomputation, during which is_recomputing() is true)
// and the output gradient is back-propagated through that fresh graph, which accumulates
// the gradients of the parameters fn uses and yields the inputs' gradients.
//
//   at::Tensor y = checkpoint([&](const std::vector<at::Tensor>& in) { return block(in[0]); },
//                             {x}, "block");   // activations inside `block` are not kept
//
// Modules: Module::set_checkpoint(kWhole) wraps the module's whole call (pre-hooks,
// forward, hooks) so, e.g., FSDP's unshard runs again before the recomputation and TP's
// collectives are redone; kPointwise asks the module to recompute only its pointwise parts
// and keep its matmul outputs (selective checkpointing; Attention, FeedForward and
// GroupedExperts implement it, recompute_pointwise() below).
// The result is bit-identical to running without checkpointing: the recomputation repeats
// the same operations on the same values (hyperpar's models draw no random numbers in
// forward). At least one input must require grad (as with PyTorch's reentrant variant),
// else the parameters inside get no gradient: checkpoint() then runs fn plainly.
// InputGradsOnly: while alive (zero-bubble pipelines' I step, autograd::grad on the stage
// input), a recomputation computes only its inputs' gradients and accumulates no parameter
// gradient; the later full backward (W) recomputes again and accumulates them.
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace hyperpar::nn {

using CheckpointFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

at::Tensor checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                      const char* name);

/// True while a checkpointed function is being recomputed in backward (on this thread).
bool is_recomputing();

class InputGradsOnly {
 public:
  InputGradsOnly();
  ~InputGradsOnly();
  InputGradsOnly(const InputGradsOnly&) = delete;
  InputGradsOnly& operator=(const InputGradsOnly&) = delete;

 private:
  bool previous_;
};

/// kPointwise: modules that implement it recompute their pointwise parts only.
enum class CheckpointMode { kNone, kWhole, kPointwise };

}  // namespace hyperpar::nn
