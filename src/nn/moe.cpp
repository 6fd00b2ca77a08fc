#include "hyperpar/nn/moe.h"

#include <ATen/ATen.h>

#include "hyperpar/core/error.h"

namespace hyperpar::nn {

FeedForward::FeedForward(int64_t dim, int64_t hidden, dtensor::InitScheme init,
                         dtensor::InitScheme out_init)
    : Module("FeedForward") {
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden, false, init));
  w2 = register_module("w2", std::make_shared<Linear>(hidden, dim, false, out_init));
  w3 = register_module("w3", std::make_shared<Linear>(dim, hidden, false, init));
}

at::Tensor FeedForward::forward(const at::Tensor& x) {
  return (*w2)(at::silu((*w1)(x)) * (*w3)(x));
}

GroupedExperts::GroupedExperts(int64_t n, int64_t dim_, int64_t hidden_, dtensor::InitScheme init,
                               dtensor::InitScheme out_init)
    : Module("GroupedExperts"), n_experts(n), dim(dim_), hidden(hidden_) {
  register_parameter("w1", {n, hidden, dim}, init);
  register_parameter("w2", {n, dim, hidden}, out_init);
  register_parameter("w3", {n, hidden, dim}, init);
}

at::Tensor GroupedExperts::forward(const at::Tensor&) {
  throw Error("GroupedExperts is driven by MoE (run_expert), not called directly");
}

at::Tensor GroupedExperts::run_expert(int64_t e, const at::Tensor& x) {
  at::Tensor w1 = value("w1")[e], w2 = value("w2")[e], w3 = value("w3")[e];
  at::Tensor h = at::silu(at::matmul(x, w1.t())) * at::matmul(x, w3.t());
  return at::matmul(h, w2.t());
}

MoE::MoE(int64_t dim, int64_t hidden, int64_t n, int64_t k, bool shared, dtensor::InitScheme init,
         dtensor::InitScheme out_init)
    : Module("MoE"), n_experts(n), top_k(k) {
  HP_CHECK(k > 0 && k <= n, "MoE: top_k ", k, " must be in [1, n_experts=", n, "]");
  router = register_module("router", std::make_shared<Linear>(dim, n, false, init));
  experts =
      register_module("experts", std::make_shared<GroupedExperts>(n, dim, hidden, init, out_init));
  if (shared)
    shared_expert = register_module("shared_expert",
                                    std::make_shared<FeedForward>(dim, hidden, init, out_init));
}

Routing MoE::route(const at::Tensor& tokens) {
  at::Tensor x = prepare_router_input ? prepare_router_input(tokens) : tokens;
  at::Tensor probs = at::softmax((*router)(x).to(at::kFloat), -1);
  auto [vals, idx] = at::topk(probs, top_k, -1, true, true);
  vals = vals / vals.sum(-1, true);
  return {idx, vals.to(tokens.scalar_type())};
}

at::Tensor MoE::local_routed_experts(const at::Tensor& tokens, const Routing& r) {
  at::Tensor x = prepare_expert_input ? prepare_expert_input(tokens) : tokens;
  at::Tensor weights = prepare_routing_weights ? prepare_routing_weights(r.weights) : r.weights;
  at::Tensor out = at::zeros_like(x);
  const int64_t local = experts->value("w1").size(0);
  HP_CHECK(local == n_experts, "MoE: ", local, " local experts of ", n_experts,
           " but no expert-parallel dispatch is installed");
  for (int64_t e = 0; e < n_experts; ++e) {
    at::Tensor hit = (r.experts == e);                   // [T, k]
    at::Tensor tok = hit.any(-1).nonzero().squeeze(-1);  // ascending token ids
    if (tok.numel() == 0) continue;
    at::Tensor w = (weights * hit.to(weights.scalar_type())).sum(-1).index_select(0, tok);
    at::Tensor y = experts->run_expert(e, x.index_select(0, tok)) * w.unsqueeze(-1);
    out = out.index_add(0, tok, y);
  }
  if (experts->reduce_output) out = experts->reduce_output(out);
  return out;
}

at::Tensor MoE::forward(const at::Tensor& x) {
  const auto shape = x.sizes().vec();
  at::Tensor tokens = x.reshape({-1, shape.back()});
  Routing r = route(tokens);
  at::Tensor y =
      routed_experts ? routed_experts(*this, tokens, r) : local_routed_experts(tokens, r);
  if (shared_expert) y = y + (*shared_expert)(tokens);
  return y.view(shape);
}

}  // namespace hyperpar::nn
