#pragma once
// Expert parallel (EP): an MoE's stacked expert weights are sharded Shard(0) over an "ep"
// mesh, so each ep rank holds E/ep whole experts; tokens travel to the experts' owners and
// back with all_to_all_single.
//
// Forward of the routed experts on one rank (ep group of e ranks, L = E/e local experts):
//   1. sort the (token, expert) pairs by expert (nn::sort_by_expert): destination-rank-major,
//      since rank r owns experts [r*L, (r+1)*L);
//   2. per destination rank, its distinct tokens: a token goes to a rank once, however many
//      of that rank's experts it is routed to;
//   3. exchange the counts first (an all_to_all of e*(L+1) int64: pairs per local expert and
//      distinct tokens per rank), so every rank knows its receive split sizes as host
//      integers, then the routing entries: per pair, its token's row (int32) and its routing
//      weight (differentiable);
//   4. all_to_all_single the distinct tokens' rows; run the local experts (nn::GroupedExperts)
//      on the pairs in expert-major order ([expert 0: src 0..e-1][expert 1: ...]), each pair
//      reading its token's row;
//   5. weight each pair's output and add it to its token's row, in expert order, so one row
//      per token goes back (all_to_all_single with the reverse splits), where it is added to
//      its token: the same additions in the same order as nn::combine_by_token.
// Every all_to_all of rows is differentiable: the backward of one with splits (in, out) is
// the all_to_all with (out, in). Results equal the single-rank MoE up to summation order.
//
// Example (e = 2, L = 2, top 2): token 7 routed to experts 2 and 3 (both on rank 1) is sent
// to rank 1 once; rank 1 returns w2 y2 + w3 y3 for it in one row.
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

/// The receive buffers of one MoE layer's token exchange, kept between steps: the rows
/// arriving in the dispatch and in the combine and the gradients arriving in both backwards,
/// each consumed at once by an index_select or index_add (which save only their indices).
struct ExchangeBuffers {
  std::shared_ptr<ReusedBuffer> dispatch = std::make_shared<ReusedBuffer>();
  std::shared_ptr<ReusedBuffer> combine = std::make_shared<ReusedBuffer>();
  std::shared_ptr<ReusedBuffer> dispatch_grad = std::make_shared<ReusedBuffer>();
  std::shared_ptr<ReusedBuffer> combine_grad = std::make_shared<ReusedBuffer>();
};

/// The exchange buffers ExpertParallel keeps on `moe`; null where it was not applied.
std::shared_ptr<const ExchangeBuffers> exchange_buffers(const nn::MoE& moe);

/// The routed-expert computation of `moe` for tokens [n, D] with ids/weights [n, k], over the
/// ep `group` (whose ranks own consecutive blocks of n_experts / group size experts).
/// Its all-to-alls count under the traffic scope "ep <tag>", whose bound is one row per
/// (token, other rank owning one of its experts) each way plus one routing entry (an int32
/// row and the weight) per pair routed to another rank; only the counts are above it.
at::Tensor expert_parallel_forward(nn::MoE& moe, const at::Tensor& tokens,
                                   const at::Tensor& expert_ids, const at::Tensor& weights,
                                   const std::shared_ptr<comm::Communicator>& group,
                                   const std::string& tag,
                                   const std::shared_ptr<ExchangeBuffers>& buffers = nullptr);

}  // namespace hyperpar::parallel
