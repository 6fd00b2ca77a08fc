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
// no capacity factor, nothing dropped.
//
// Routed computation, the same with or without expert parallel:
//   1. the T*k (token, expert) pairs are sorted by expert, stably (ascending token order
//      inside each expert): sort_by_expert -> ExpertOrder;
//   2. the tokens of the sorted pairs are gathered into one expert-major buffer and run by
//      GroupedExperts::forward, which cuts it by tokens_per_expert (expert parallel moves
//      this buffer to the experts' owners and back with all_to_all, parallel/expert_parallel.h);
//   3. combine_by_token: each pair's output is scaled by its routing weight and added to its
//      token's row.
// Example: T=3, k=2, experts [[1,0],[0,2],[1,2]] -> sorted pairs (token:expert)
// 0:0 1:0 | 0:1 2:1 | 1:2 2:2, tokens_per_expert {2, 2, 2}.
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
  /// x [N, D]: tokens grouped by local expert, tokens_per_expert[l] rows for local expert l
  /// in order (set by the caller just before; sums to N). Returns [N, D] in the same order.
  /// With no tokens at all the result is [0, D] but still depends on the weights, so the
  /// weights' gradient (and FSDP's reduction of it) happens on every rank.
  at::Tensor forward(const at::Tensor& x) override;
  /// Expert `e` (a local index into the stacked weights) on tokens x [n, D].
  at::Tensor run_expert(int64_t e, const at::Tensor& x);
  std::vector<int64_t> tokens_per_expert;
  /// Set by tensor parallel: the partial sums of TP-split experts are reduced here.
  TensorFn reduce_output;
  int64_t n_experts, dim, hidden;
};

/// The "routing" part of MoE, exposed for expert parallel.
struct Routing {
  at::Tensor experts;  // [T, k] int64 expert ids
  at::Tensor weights;  // [T, k] renormalised top-k probabilities (x's dtype)
};

/// The T*k (token, expert) pairs sorted by expert (stable).
struct ExpertOrder {
  at::Tensor token;                       // [T*k] token index of each sorted pair
  at::Tensor pair;                        // [T*k] index of each sorted pair into experts.view(-1)
  std::vector<int64_t> pairs_per_expert;  // [n_experts], host integers
};
ExpertOrder sort_by_expert(const at::Tensor& experts, int64_t n_experts);

/// out[T, D]: out[token[i]] += y[i] * weights.view(-1)[pair[i]] over the sorted pairs.
at::Tensor combine_by_token(const at::Tensor& y, const at::Tensor& weights,
                            const ExpertOrder& order, int64_t n_tokens);

class MoE : public Module {
 public:
  MoE(int64_t dim, int64_t hidden, int64_t n_experts, int64_t top_k, bool shared_expert,
      dtensor::InitScheme init, dtensor::InitScheme out_init);
  at::Tensor forward(const at::Tensor& x) override;
  Routing route(const at::Tensor& tokens);
  /// Runs the routed experts on tokens [T, D] (the local experts, all of them without EP).
  /// Replaced by expert parallel with its dispatch/compute/combine.
  std::function<at::Tensor(MoE&, const at::Tensor& tokens, const Routing&)> routed_experts;
  /// State of whoever installed routed_experts, living as long as the module (expert parallel
  /// keeps its exchange buffers here: parallel::exchange_buffers).
  std::shared_ptr<void> routed_experts_state;
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
