#include "hyperpar/parallel/expert_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>
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
  const int64_t e = group->size(), n_experts = moe.n_experts, me = group->rank();
  HP_CHECK(n_experts % e == 0, "expert parallel: ", n_experts, " experts of ", tag,
           " do not divide over the ", e, " ranks of ", group->label());
  const int64_t local = n_experts / e;
  comm::TrafficScope traffic("ep " + tag);
  nn::ExpertOrder order = nn::sort_by_expert(expert_ids, n_experts);
  const at::Tensor pair_token = order.token.to(c10::kCPU).contiguous();
  const int64_t* pair_tok = pair_token.data_ptr<int64_t>();

  // Each destination rank r gets each token once, however many of r's experts it goes to:
  // its distinct tokens (ascending) and, per sorted pair, the row of its token among them.
  std::vector<int64_t> send_rows(e, 0), pairs_to(e, 0), send_token;
  std::vector<int32_t> pair_row(static_cast<size_t>(pair_token.numel()));
  for (int64_t r = 0, p0 = 0; r < e; ++r) {
    for (int64_t l = 0; l < local; ++l) pairs_to[r] += order.pairs_per_expert[r * local + l];
    const int64_t p1 = p0 + pairs_to[r];
    std::vector<int64_t> distinct(pair_tok + p0, pair_tok + p1);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    for (int64_t p = p0; p < p1; ++p)
      pair_row[p] = static_cast<int32_t>(
          std::lower_bound(distinct.begin(), distinct.end(), pair_tok[p]) - distinct.begin());
    send_rows[r] = static_cast<int64_t>(distinct.size());
    send_token.insert(send_token.end(), distinct.begin(), distinct.end());
    p0 = p1;
  }

  // Counts first, per destination rank r: the pairs for each of r's local experts, then the
  // distinct tokens r gets. Received: rc[s * (local + 1) + l] = pairs rank s sends to my
  // local expert l; rc[s * (local + 1) + local] = the rows (distinct tokens) it sends me.
  const int64_t stride = local + 1;
  std::vector<int64_t> counts(e * stride, 0);
  for (int64_t r = 0; r < e; ++r) {
    for (int64_t l = 0; l < local; ++l)
      counts[r * stride + l] = order.pairs_per_expert[r * local + l];
    counts[r * stride + local] = send_rows[r];
  }
  at::Tensor send_counts = host_long(counts);
  at::Tensor recv_counts = at::empty({e * stride}, send_counts.options());
  group->all_to_all_single(recv_counts, send_counts, {}, {}, {tag + " expert counts", false});
  const int64_t* all_rc = recv_counts.data_ptr<int64_t>();
  std::vector<int64_t> rc(n_experts), recv_rows(e, 0), pairs_from(e, 0), per_expert(local, 0);
  for (int64_t r = 0; r < e; ++r) {
    for (int64_t l = 0; l < local; ++l) {
      rc[r * local + l] = all_rc[r * stride + l];
      pairs_from[r] += rc[r * local + l];
      per_expert[l] += rc[r * local + l];
    }
    recv_rows[r] = all_rc[r * stride + local];
  }
  // The least traffic: rows and routing entries (row index, weight) for other ranks only.
  const auto to_others = [me](const std::vector<int64_t>& v) { return sum(v) - v[me]; };

  // The routing entries: for each pair, its token's row in the block sent to its expert's
  // rank (int32) and its routing weight (differentiable), source-major on arrival.
  at::Tensor send_pair_row =
      at::tensor(pair_row, at::TensorOptions().dtype(at::kInt).device(c10::kCPU));
  at::Tensor recv_pair_row = at::empty({sum(pairs_from)}, send_pair_row.options());
  comm::record_traffic_bound("all_to_all_single", static_cast<double>(to_others(pairs_to) * 4));
  group->all_to_all_single(recv_pair_row, send_pair_row, pairs_from, pairs_to,
                           {tag + " pair rows", false});
  at::Tensor pair_weight = weights.reshape({-1}).index_select(0, order.pair).unsqueeze(-1);
  at::Tensor arrived_weight =
      all_to_all_rows(pair_weight, group, pairs_from, pairs_to, tag + " routing weights",
                      to_others(pairs_to), to_others(pairs_from));

  // Received pairs, source-major ([src s: expert 0..L-1]), in expert-major order ([expert l:
  // src 0..e-1]), and the row of arrived tokens each one reads.
  std::vector<int64_t> src_pair_start(e, 0), src_row_start(e, 0);
  for (int64_t r = 1; r < e; ++r) {
    src_pair_start[r] = src_pair_start[r - 1] + pairs_from[r - 1];
    src_row_start[r] = src_row_start[r - 1] + recv_rows[r - 1];
  }
  const int32_t* got_row = recv_pair_row.data_ptr<int32_t>();
  std::vector<int64_t> to_expert_major, row_of_expert_major;
  to_expert_major.reserve(sum(pairs_from));
  row_of_expert_major.reserve(sum(pairs_from));
  for (int64_t l = 0; l < local; ++l)
    for (int64_t r = 0; r < e; ++r) {
      int64_t start = src_pair_start[r];
      for (int64_t j = 0; j < l; ++j) start += rc[r * local + j];
      for (int64_t i = 0; i < rc[r * local + l]; ++i) {
        to_expert_major.push_back(start + i);
        row_of_expert_major.push_back(src_row_start[r] + got_row[start + i]);
      }
    }

  const at::Tensor sent = host_long(send_token);
  at::Tensor routed = tokens.index_select(0, sent);
  // Every received block of rows (both ways, forward and backward) is consumed at once by an
  // index_select or index_add, which keep only their indices: buffers reused every step.
  at::Tensor arrived =
      all_to_all_rows(routed, group, recv_rows, send_rows, tag + " dispatch", to_others(send_rows),
                      to_others(recv_rows), buffers ? buffers->dispatch : nullptr,
                      buffers ? buffers->dispatch_grad : nullptr);
  const at::Tensor rows = host_long(row_of_expert_major);
  moe.experts->tokens_per_expert = per_expert;
  at::Tensor y = (*moe.experts)(arrived.index_select(0, rows));
  // Weighted and summed per arrived token here, in expert order (as nn::combine_by_token
  // adds a token's pairs), so one row per token goes back.
  at::Tensor weighted = y * arrived_weight.index_select(0, host_long(to_expert_major));
  at::Tensor per_token =
      at::zeros({arrived.size(0), y.size(-1)}, y.options()).index_add(0, rows, weighted);
  at::Tensor back = all_to_all_rows(per_token, group, send_rows, recv_rows, tag + " combine",
                                    to_others(recv_rows), to_others(send_rows),
                                    buffers ? buffers->combine : nullptr,
                                    buffers ? buffers->combine_grad : nullptr);
  return at::zeros({tokens.size(0), back.size(-1)}, back.options()).index_add(0, sent, back);
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
