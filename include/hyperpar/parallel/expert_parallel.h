#pragma once
// Expert parallel (EP): an MoE's stacked expert weights are sharded Shard(0) over an "ep"
// mesh, so each ep rank holds E/ep whole experts; tokens travel to the experts' owners and
// back with all_to_all_single.
//
// Forward of the routed experts on one rank (ep group of e ranks, L = E/e local experts):
//   1. sort the (token, expert) pairs by expert (nn::sort_by_expert): the gathered buffer is
//      destination-rank-major, since rank r owns experts [r*L, (r+1)*L);
//   2. exchange the per-expert counts first (an all_to_all of E int64 per rank), so every
//      rank knows its receive split sizes as host integers;
//   3. all_to_all_single the tokens (split sizes = pairs per destination rank); what arrives
//      is source-rank-major: [src 0: expert 0..L-1][src 1: expert 0..L-1]...;
//   4. permute to expert-major ([expert 0: src 0..e-1][expert 1: ...]) and run the local
//      experts (nn::GroupedExperts), permute back to source-rank-major;
//   5. all_to_all_single back (the reverse split sizes) and combine: weight each pair's
//      output by its routing weight and add it to its token (nn::combine_by_token).
// Both all_to_alls are differentiable: the backward of a dispatch with splits (in, out) is
// the all_to_all with (out, in). Results equal the single-rank MoE up to summation order.
//
// Two ways of composing with tensor parallel (torchtitan's expert_tensor_parallel_degree):
//   * ep mesh 1-D (expert_tp = 1): ep borrows ranks from dp_shard*tp, experts are whole on
//     their owner. The tp ranks of a group hold the same tokens, so `token_split` (the tp
//     mesh) gives each tp rank 1/tp of them to dispatch (the rest arrives by all-gather
//     after the combine); with tp = 1 no split is needed.
//   * ep mesh 2-D ("ep", "tp") (expert_tp = tp): ep borrows from dp_shard only and every
//     expert is additionally split on its hidden dim over tp (w1/w3 (Shard(0), Shard(1)),
//     w2 (Shard(0), Shard(2))); the tp ranks dispatch the same tokens over their ep group and
//     the partial expert outputs are reduced over tp as MoETensorParallel does.
// `input_grad_partial` says the MoE's input gradient is treated as a partial sum over tp (a
// PrepareModuleInput with a Partial gradient: sequence parallel).
// The meshes themselves and the expert-FSDP gradient scaling: parallel/expert_mesh.h.
//
//   apply_plan(model, ep_mesh, {{"layers.*.moe", std::make_shared<ExpertParallel>()}});
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperpar/comm/communicator.h"
#include "hyperpar/core/reused_buffer.h"
#include "hyperpar/nn/moe.h"
#include "hyperpar/parallel/tensor_parallel.h"

namespace hyperpar::parallel {

class ExpertParallel : public ParallelStyle {
 public:
  explicit ExpertParallel(std::optional<mesh::DeviceMesh> token_split = std::nullopt,
                          bool input_grad_partial = false)
      : token_split_(std::move(token_split)), input_grad_partial_(input_grad_partial) {}
  std::string name() const override { return "ExpertParallel"; }
  /// `ep` is the 1-D ep mesh or the 2-D ("ep", "tp") mesh. Works under DeviceContext(meta).
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& ep) const override;

 private:
  std::optional<mesh::DeviceMesh> token_split_;
  bool input_grad_partial_;
};

/// all_to_all_single of rows, differentiable: sends in_rows[r] rows of x (in order) to group
/// rank r and returns the out_rows[s] rows received from each rank s, concatenated. The
/// gradient goes back with the splits swapped. x is copied to a contiguous buffer first.
/// bound_rows (forward) and bound_rows_backward >= 0: the least rows this rank must send,
/// added to the traffic bound of the current scope (comm/traffic.h) when recording.
/// out_buffer / grad_buffer: receive the forward's rows / the gradient there instead of in a
/// fresh tensor (only for results consumed at once: core/reused_buffer.h).
at::Tensor all_to_all_rows(const at::Tensor& x, std::shared_ptr<comm::Communicator> group,
                           std::vector<int64_t> out_rows, std::vector<int64_t> in_rows,
                           const std::string& tag, int64_t bound_rows = -1,
                           int64_t bound_rows_backward = -1,
                           std::shared_ptr<ReusedBuffer> out_buffer = nullptr,
                           std::shared_ptr<ReusedBuffer> grad_buffer = nullptr);

/// The receive buffers of one MoE layer's token exchange, kept between steps: the dispatch's
/// rows (index_selected into expert order at once) and the gradients arriving in both
/// backwards (consumed at once by index_select's backward). The combine's rows are not among
/// them: combine_by_token saves them for the routing weights' gradient.
struct ExchangeBuffers {
  std::shared_ptr<ReusedBuffer> dispatch = std::make_shared<ReusedBuffer>();
  std::shared_ptr<ReusedBuffer> dispatch_grad = std::make_shared<ReusedBuffer>();
  std::shared_ptr<ReusedBuffer> combine_grad = std::make_shared<ReusedBuffer>();
};

/// The exchange buffers ExpertParallel keeps on `moe`; null where it was not applied.
std::shared_ptr<const ExchangeBuffers> exchange_buffers(const nn::MoE& moe);

/// The routed-expert computation of `moe` for tokens [n, D] with ids/weights [n, k], over the
/// ep `group` (whose ranks own consecutive blocks of n_experts / group size experts).
/// Its all-to-alls count under the traffic scope "ep <tag>", whose bound is one row per
/// (token, other rank owning one of its experts) each way: a token routed to two experts of
/// the same rank is sent twice today, which the report shows as bytes above the bound.
at::Tensor expert_parallel_forward(nn::MoE& moe, const at::Tensor& tokens,
                                   const at::Tensor& expert_ids, const at::Tensor& weights,
                                   const std::shared_ptr<comm::Communicator>& group,
                                   const std::string& tag,
                                   const std::shared_ptr<ExchangeBuffers>& buffers = nullptr);

}  // namespace hyperpar::parallel
