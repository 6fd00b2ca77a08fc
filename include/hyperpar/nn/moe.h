#pragma once
// SwiGLU feed-forward and the mixture-of-experts layer.
//
// FeedForward: y = w2( silu(w1 x) * (w3 x) ), w1, w3: [hidden, dim], w2: [dim, hidden].
//
// MoE on x [B, S, D] (tokens T = B*S):
//   logits = router.gate(x) [T, E];  probs = softmax(logits) in float32
//   (vals, experts) = top_k(probs, k);  weights = vals / sum(vals)   (renormalised)
//   y_t = sum_j weights[t, j] * expert_{experts[t, j]}(x_t)  (+ shared_expert(x_t) if any)
// Experts are stacked weights (GroupedExperts): w1, w3 [E, hidden, D], w2 [E, D, hidden],
// expert e computing w2[e] (silu(w1[e] x) * (w3[e] x)). Every token reaches its k experts:
// no capacity factor, nothing dropped. Tokens are processed expert by expert in ascending
// token order, so results do not depend on how experts are split across ranks.
#include "hyperpar/nn/layers.h"

namespace hyperpar::nn {

class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, dtensor::InitScheme init, dtensor::InitScheme out_init);
  at::Tensor forward(const at::Tensor& x) override;
  std::shared_ptr<Linear> w1, w2, w3;
};

class GroupedExperts : public Module {
 public:
  GroupedExperts(int64_t n_experts, int64_t dim, int64_t hidden, dtensor::InitScheme init,
                 dtensor::InitScheme out_init);
  /// Not used directly: MoE calls run_expert per expert.
  at::Tensor forward(const at::Tensor& x) override;
  /// Expert `e` (a local index into the stacked weights) on tokens x [n, D].
  at::Tensor run_expert(int64_t e, const at::Tensor& x);
  /// Set by tensor parallel: the partial sums of TP-split experts are reduced here.
  TensorFn reduce_output;
  int64_t n_experts, dim, hidden;
};

/// The "routing" part of MoE, exposed for expert parallel.
struct Routing {
  at::Tensor experts;  // [T, k] int64 expert ids
  at::Tensor weights;  // [T, k] renormalised top-k probabilities (x's dtype)
};

class MoE : public Module {
 public:
  MoE(int64_t dim, int64_t hidden, int64_t n_experts, int64_t top_k, bool shared_expert,
      dtensor::InitScheme init, dtensor::InitScheme out_init);
  at::Tensor forward(const at::Tensor& x) override;
  Routing route(const at::Tensor& tokens);
  /// Runs the routed experts on tokens [T, D] (the local experts, all of them without EP).
  /// Replaced by expert parallel with its dispatch/compute/combine.
  std::function<at::Tensor(MoE&, const at::Tensor& tokens, const Routing&)> routed_experts;
  /// Expert computation without EP: every expert locally.
  at::Tensor local_routed_experts(const at::Tensor& tokens, const Routing& r);
  int64_t n_experts, top_k;
  std::shared_ptr<Linear> router;
  std::shared_ptr<GroupedExperts> experts;
  std::shared_ptr<FeedForward> shared_expert;  // may be null
  /// Set by tensor parallel: applied to the tokens the experts see (their gradient is a
  /// partial sum over TP ranks) and to the tokens the router sees (replicated compute).
  /// The routing weights scale each rank's partial expert outputs, so their gradient is a
  /// partial sum as well: prepare_routing_weights (set by tensor parallel) all-reduces it.
  TensorFn prepare_expert_input, prepare_router_input, prepare_routing_weights;
};

}  // namespace hyperpar::nn
