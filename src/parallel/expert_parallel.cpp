#include "hyperpar/parallel/expert_parallel.h"

#include <ATen/ATen.h>

#include <numeric>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/nn/moe.h"

namespace hyperpar::parallel {

using namespace dtensor;

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

at::Tensor host_long(const std::vector<int64_t>& v) {
  // Explicit CPU: index bookkeeping never follows an ambient device (DESIGN.md invariant 1).
  return at::tensor(v, at::TensorOptions().dtype(at::kLong).device(c10::kCPU));
}

// Rows [chunk of this tp rank] of a tp-replicated [T, ...] tensor. Gradient: all-gathered
// (the other ranks' rows come from their own slices), or with `partial_grad` left as this
// rank's rows with zeros elsewhere (a partial sum the caller reduces).
at::Tensor split_rows(const at::Tensor& x, const mesh::DeviceMesh& tp, bool partial_grad,
                      const std::string& tag) {
  const int64_t n = tp.size(), coord = tp.get_local_rank(0), rows = x.size(0);
  HP_CHECK(rows % n == 0, "expert parallel: the ", rows, " tokens of ", tag,
           " must divide by the tp size ", n,
           " (each tp rank dispatches an equal share); change the batch or seq_len");
  if (!partial_grad) return relayout(x, tp, Replicate{}, Shard{0}, std::nullopt, tag);
  const int64_t per = rows / n;
  return differentiable(
      x, [=](const at::Tensor& t) { return t.narrow(0, coord * per, per).contiguous(); },
      [=](const at::Tensor& g) {
        std::vector<int64_t> shape = g.sizes().vec();
        shape[0] = rows;
        at::Tensor full = at::zeros(shape, g.options());
        full.narrow(0, coord * per, per).copy_(g);
        return full;
      },
      "ep_token_split");
}

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, std::shared_ptr<comm::Communicator> group,
                           std::vector<int64_t> out_rows, std::vector<int64_t> in_rows,
                           const std::string& tag, int64_t bound_rows, int64_t bound_rows_backward,
                           std::shared_ptr<ReusedBuffer> out_buffer,
                           std::shared_ptr<ReusedBuffer> grad_buffer) {
  // The backward's all-to-all counts under the scope of the forward (comm/traffic.h).
  const std::string scope = comm::TrafficScope::current();
  auto run = [group, tag, scope](const at::Tensor& in, const std::vector<int64_t>& out_r,
                                 const std::vector<int64_t>& in_r, int64_t bound_rows,
                                 const std::shared_ptr<ReusedBuffer>& buffer, const char* what) {
    comm::TrafficScope traffic(scope);
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] = sum(out_r);
    at::Tensor out = buffer ? buffer->take(shape, in.options()) : at::empty(shape, in.options());
    if (bound_rows >= 0 && in.size(0) > 0)
      comm::record_traffic_bound("all_to_all_single",
                                 static_cast<double>(bound_rows * (in.numel() / in.size(0)) *
                                                     static_cast<int64_t>(in.element_size())));
    group->all_to_all_single(out, in.contiguous(), out_r, in_r, {tag + what, false});
    return out;
  };
  return differentiable(
      x, [=](const at::Tensor& t) { return run(t, out_rows, in_rows, bound_rows, out_buffer, ""); },
      [=](const at::Tensor& g) {
        return run(g, in_rows, out_rows, bound_rows_backward, grad_buffer, " (backward)");
      },
      "all_to_all_rows");
}

at::Tensor expert_parallel_forward(nn::MoE& moe, const at::Tensor& tokens,
                                   const at::Tensor& expert_ids, const at::Tensor& weights,
                                   const std::shared_ptr<comm::Communicator>& group,
                                   const std::string& tag,
                                   const std::shared_ptr<ExchangeBuffers>& buffers) {
  const int64_t e = group->size(), n_experts = moe.n_experts;
  HP_CHECK(n_experts % e == 0, "expert parallel: ", n_experts, " experts of ", tag,
           " do not divide over the ", e, " ranks of ", group->label());
  const int64_t local = n_experts / e;
  comm::TrafficScope traffic("ep " + tag);
  nn::ExpertOrder order = nn::sort_by_expert(expert_ids, n_experts);
  // Counts first, per destination rank r: the pairs for each of r's local experts, then how
  // many distinct tokens go to r (the traffic bound: a token needs to reach a rank once,
  // however many of its experts live there). Received: rc[s * (local + 1) + l] = pairs rank
  // s sends to my local expert l; rc[s * (local + 1) + local] = its distinct tokens.
  const int64_t stride = local + 1;
  std::vector<int64_t> counts(e * stride, 0);
  for (int64_t r = 0; r < e; ++r)
    for (int64_t l = 0; l < local; ++l)
      counts[r * stride + l] = order.pairs_per_expert[r * local + l];
  if (expert_ids.numel() > 0 && !expert_ids.is_meta()) {
    at::Tensor owner = at::floor_divide(expert_ids.reshape({expert_ids.size(0), -1}), local);
    at::Tensor tokens_per_rank = at::zeros({owner.size(0), e}, owner.options().dtype(at::kBool))
                                     .scatter_(1, owner, true)
                                     .sum(0, /*keepdim=*/false, at::kLong)
                                     .contiguous();
    const int64_t* n = tokens_per_rank.data_ptr<int64_t>();
    for (int64_t r = 0; r < e; ++r) counts[r * stride + local] = n[r];
  }
  at::Tensor send_counts = host_long(counts);
  at::Tensor recv_counts = at::empty({e * stride}, send_counts.options());
  group->all_to_all_single(recv_counts, send_counts, {}, {}, {tag + " expert counts", false});
  const int64_t* all_rc = recv_counts.data_ptr<int64_t>();
  std::vector<int64_t> rc(n_experts);
  int64_t tokens_out = 0, tokens_in = 0;  // distinct tokens leaving / arriving (bounds)
  for (int64_t r = 0; r < e; ++r) {
    for (int64_t l = 0; l < local; ++l) rc[r * local + l] = all_rc[r * stride + l];
    if (r == group->rank()) continue;
    tokens_out += counts[r * stride + local];
    tokens_in += all_rc[r * stride + local];
  }
  std::vector<int64_t> send_rows(e, 0), recv_rows(e, 0), per_expert(local, 0);
  for (int64_t r = 0; r < e; ++r)
    for (int64_t l = 0; l < local; ++l) {
      send_rows[r] += order.pairs_per_expert[r * local + l];
      recv_rows[r] += rc[r * local + l];
      per_expert[l] += rc[r * local + l];
    }
  // Source-rank-major -> expert-major permutation of the received rows.
  std::vector<int64_t> src_start(e, 0);
  for (int64_t r = 1; r < e; ++r) src_start[r] = src_start[r - 1] + recv_rows[r - 1];
  std::vector<int64_t> to_expert_major;
  to_expert_major.reserve(sum(recv_rows));
  for (int64_t l = 0; l < local; ++l)
    for (int64_t r = 0; r < e; ++r) {
      int64_t start = src_start[r];
      for (int64_t j = 0; j < l; ++j) start += rc[r * local + j];
      for (int64_t i = 0; i < rc[r * local + l]; ++i) to_expert_major.push_back(start + i);
    }
  std::vector<int64_t> to_source_major(to_expert_major.size());
  for (size_t i = 0; i < to_expert_major.size(); ++i) to_source_major[to_expert_major[i]] = i;

  at::Tensor routed = tokens.index_select(0, order.token);
  // The received rows and both gradients are consumed by an index_select (forward or
  // backward) right away, so they may live in buffers reused by the next step.
  at::Tensor arrived = all_to_all_rows(routed, group, recv_rows, send_rows, tag + " dispatch",
                                       tokens_out, tokens_in, buffers ? buffers->dispatch : nullptr,
                                       buffers ? buffers->dispatch_grad : nullptr);
  moe.experts->tokens_per_expert = per_expert;
  at::Tensor y = (*moe.experts)(arrived.index_select(0, host_long(to_expert_major)));
  at::Tensor back = all_to_all_rows(y.index_select(0, host_long(to_source_major)), group, send_rows,
                                    recv_rows, tag + " combine", tokens_in, tokens_out, nullptr,
                                    buffers ? buffers->combine_grad : nullptr);
  return nn::combine_by_token(back, weights, order, tokens.size(0));
}

std::shared_ptr<const ExchangeBuffers> exchange_buffers(const nn::MoE& moe) {
  // Only ExpertParallel::apply sets both; another routed_experts has no exchange buffers.
  if (!moe.routed_experts || !moe.routed_experts_state) return nullptr;
  return std::static_pointer_cast<const ExchangeBuffers>(moe.routed_experts_state);
}

void ExpertParallel::apply(nn::Module& m, const std::string& fqn,
                           const mesh::DeviceMesh& ep_mesh) const {
  auto* moe_p = dynamic_cast<nn::MoE*>(&m);
  HP_CHECK(moe_p != nullptr, "ExpertParallel cannot be applied to '", fqn, "' (a ", m.type_name(),
           "); it applies to MoE modules");
  auto& moe = *moe_p;
  HP_CHECK(ep_mesh.ndim() == 1 || ep_mesh.ndim() == 2,
           "ExpertParallel: expected a 1-D ep mesh or a 2-D (ep, tp) mesh, got ",
           ep_mesh.to_string());
  HP_CHECK(moe.n_experts % ep_mesh.size(0) == 0, "ExpertParallel: ", moe.n_experts, " experts of '",
           fqn, "' do not divide by the ep size ", ep_mesh.size(0));
  auto& ex = *moe.experts;
  for (const char* w : {"w1", "w2", "w3"})
    HP_CHECK(!ex.param(w).is_distributed(), "ExpertParallel: ", fqn, ".experts.", w,
             " is already distributed as ", ex.param(w).placements_string(),
             "; apply expert parallel instead of MoETensorParallel, before fully_shard");
  const mesh::DeviceMesh ep = ep_mesh.ndim() == 1 ? ep_mesh : ep_mesh[ep_mesh.dim_names()[0]];
  if (ep_mesh.ndim() == 2) {
    HP_CHECK(!token_split_, "ExpertParallel: a token split and a 2-D (ep, tp) mesh exclude ",
             "each other (tp ranks already share the experts' work)");
    distribute_parameter(ex.param("w1"), ep_mesh, {Shard{0}, Shard{1}});
    distribute_parameter(ex.param("w3"), ep_mesh, {Shard{0}, Shard{1}});
    distribute_parameter(ex.param("w2"), ep_mesh, {Shard{0}, Shard{2}});
    install_expert_tp_hooks(moe, ep_mesh[ep_mesh.dim_names()[1]], fqn, input_grad_partial_);
  } else {
    for (const char* w : {"w1", "w2", "w3"}) distribute_parameter(ex.param(w), ep, {Shard{0}});
    if (token_split_ && input_grad_partial_) count_router_grad_once(moe, *token_split_);
  }
  const auto split = token_split_;
  const bool partial = input_grad_partial_;
  auto buffers = std::make_shared<ExchangeBuffers>();
  moe.routed_experts_state = buffers;
  moe.routed_experts = [ep, split, partial, fqn, buffers](nn::MoE& self, const at::Tensor& tokens,
                                                          const nn::Routing& r) {
    at::Tensor x = self.prepare_expert_input ? self.prepare_expert_input(tokens) : tokens;
    at::Tensor w =
        self.prepare_routing_weights ? self.prepare_routing_weights(r.weights) : r.weights;
    at::Tensor ids = r.experts;
    if (split && split->size() > 1) {
      x = split_rows(x, *split, partial, fqn + " tokens");
      w = split_rows(w, *split, false, fqn + " routing weights");
      const int64_t per = ids.size(0) / split->size();
      ids = ids.narrow(0, split->get_local_rank(0) * per, per);
    }
    at::Tensor out = expert_parallel_forward(self, x, ids, w, ep.get_group(0), fqn, buffers);
    if (split && split->size() > 1)
      out = relayout(out, *split, Shard{0}, Replicate{}, std::nullopt, fqn + " output");
    if (self.experts->reduce_output) out = self.experts->reduce_output(out);
    return out;
  };
}

}  // namespace hyperpar::parallel
