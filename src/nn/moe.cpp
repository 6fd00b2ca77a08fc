#include "hyperpar/nn/moe.h"

#include <ATen/ATen.h>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/fused_ops.h"
#include "hyperpar/nn/shared_input_linear.h"

namespace hyperpar::nn {

FeedForward::FeedForward(int64_t dim, int64_t hidden, dtensor::InitScheme init,
                         dtensor::InitScheme out_init)
    : Module("FeedForward") {
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden, false, init));
  w2 = register_module("w2", std::make_shared<Linear>(hidden, dim, false, out_init));
  w3 = register_module("w3", std::make_shared<Linear>(dim, hidden, false, init));
}

namespace {
// silu(a) * b (nn/fused_ops.h), recomputed in backward under selective checkpointing (a, b:
// matmul outputs).
at::Tensor gate(const at::Tensor& a, const at::Tensor& b, bool recompute) {
  auto f = [](const std::vector<at::Tensor>& in) { return swiglu(in[0], in[1]); };
  return recompute ? checkpoint(f, {a, b}, "swiglu") : f({a, b});
}
}  // namespace

at::Tensor FeedForward::forward(const at::Tensor& x) {
  const auto h13 = call_linears_on_shared_input({w1.get(), w3.get()}, x);
  return (*w2)(gate(h13[0], h13[1], checkpoint_mode() == CheckpointMode::kPointwise));
}

GroupedExperts::GroupedExperts(int64_t n, int64_t dim_, int64_t hidden_, dtensor::InitScheme init,
                               dtensor::InitScheme out_init)
    : Module("GroupedExperts"), n_experts(n), dim(dim_), hidden(hidden_) {
  register_parameter("w1", {n, hidden, dim}, init);
  register_parameter("w2", {n, dim, hidden}, out_init);
  register_parameter("w3", {n, hidden, dim}, init);
}

at::Tensor GroupedExperts::forward(const at::Tensor& x) {
  const int64_t local = static_cast<int64_t>(tokens_per_expert.size());
  int64_t total = 0;
  for (int64_t n : tokens_per_expert) total += n;
  const int64_t held = value("w1").size(0);  // experts this rank computes (EP-local)
  HP_CHECK(local == held, "GroupedExperts: tokens_per_expert has ", local, " entries for ", held,
           " local experts");
  HP_CHECK(x.dim() == 2 && total == x.size(0), "GroupedExperts: input ", x.sizes(),
           " does not hold the ", total, " rows tokens_per_expert announces");
  std::vector<at::Tensor> outs;
  int64_t row = 0;
  for (int64_t l = 0; l < local; ++l) {
    const int64_t n = tokens_per_expert[l];
    if (n > 0) outs.push_back(run_expert(l, x.narrow(0, row, n)));
    row += n;
  }
  if (!outs.empty()) return at::cat(outs);
  // Nothing routed here: a [0, D] result that still depends on every weight.
  at::Tensor zero = (value("w1").sum() + value("w2").sum() + value("w3").sum()) * 0;
  return x.narrow(0, 0, 0) + zero.to(x.scalar_type());
}

at::Tensor GroupedExperts::run_expert(int64_t e, const at::Tensor& x) {
  at::Tensor w1 = value("w1")[e], w2 = value("w2")[e], w3 = value("w3")[e];
  const auto h13 = linears_on_shared_input(x, {w1, w3});
  at::Tensor h = gate(h13[0], h13[1], checkpoint_mode() == CheckpointMode::kPointwise);
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

ExpertOrder sort_by_expert(const at::Tensor& experts, int64_t n_experts) {
  HP_CHECK(experts.dim() == 2 && experts.scalar_type() == at::kLong,
           "sort_by_expert: expected [T, k] int64 expert ids, got ", experts.sizes(), " ",
           experts.scalar_type());
  at::Tensor flat = experts.reshape({-1});
  auto sorted = at::sort(flat, /*stable=*/true, 0, false);
  ExpertOrder o;
  o.pair = std::get<1>(sorted);
  o.token = at::floor_divide(o.pair, experts.size(1));
  at::Tensor counts = at::bincount(flat, {}, n_experts).to(at::kLong).contiguous();
  HP_CHECK(counts.numel() == n_experts, "sort_by_expert: expert id out of range [0, ", n_experts,
           ")");
  const int64_t* c = counts.data_ptr<int64_t>();
  o.pairs_per_expert.assign(c, c + n_experts);
  return o;
}

at::Tensor combine_by_token(const at::Tensor& y, const at::Tensor& weights,
                            const ExpertOrder& order, int64_t n_tokens) {
  at::Tensor w = weights.reshape({-1}).index_select(0, order.pair).unsqueeze(-1);
  return at::zeros({n_tokens, y.size(-1)}, y.options()).index_add(0, order.token, y * w);
}

at::Tensor MoE::local_routed_experts(const at::Tensor& tokens, const Routing& r) {
  at::Tensor x = prepare_expert_input ? prepare_expert_input(tokens) : tokens;
  at::Tensor weights = prepare_routing_weights ? prepare_routing_weights(r.weights) : r.weights;
  ExpertOrder order = sort_by_expert(r.experts, n_experts);
  experts->tokens_per_expert = order.pairs_per_expert;
  at::Tensor y = (*experts)(x.index_select(0, order.token));
  at::Tensor out = combine_by_token(y, weights, order, x.size(0));
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
