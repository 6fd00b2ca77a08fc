#pragma once
// fully_shard: FSDP2 semantics on hyperpar modules, composable with tensor parallel.
//
//   for (auto& block : model.layers) fully_shard(*block, dp_mesh, opts);   // bottom-up
//   fully_shard(model, dp_mesh, opts);                                     // root: the rest
//
// Each call makes one parameter group of the module's parameters not claimed by an inner
// call. Every managed parameter becomes sharded on one dim d over the data-parallel mesh
// (1-D: FSDP; 2-D (replicate, shard): HSDP): dim 0, or the dim FSDPOptions::
// shard_placement_fn picks for it (FSDP2's shard_placement_fn). A TP-distributed parameter
// keeps its TP placement and gets the combined spec on concatenate(dp_mesh, tp_mesh): FSDP
// shards dim d of its TP shard, i.e. Shard(d) on dp, or StridedShard(d, f) when TP/EP also
// shards dim d over mesh dims of total size f (then dim d must divide by f). The TP/EP mesh
// may be N-D (experts on ("ep", "tp")). An uneven dim d is split as torch.chunk does, and
// every rank's segment of the flat buffers is padded to the largest chunk.
//
//   Experts w1 [2 local experts, 704, 512] over 4 shard ranks: dim 0 gives chunks of
//   1, 1, 0, 0 experts, so every all-gather moves 4 experts' rows for 2 (twice the bound);
//   shard_placement_fn -> 1 gives each rank [2, 176, 512] and no padding (torchtitan's
//   choice for experts; least_padded_dim below picks it; the trainer uses it for every group).
//
// Forward: the module's pre-forward hook unshards its group: host-shared (below) where it
// can; else per parameter (FSDPCollectives, below) where every parameter splits evenly on dim
// 0; else with one flat all-gather (copy-in of every local shard, padded, cast to param_dtype;
// copy-out into per-parameter unsharded tensors). With reshard_after_forward the unsharded storage
// is freed after the module's forward and refilled (all-gather again, written through an alias so
// saved tensors see it) when backward reaches the module's output; FSDPOptions::reshard_to keeps a
// larger post-forward shard so that refill stays within a smaller group.
//
// Host-shared (FSDPOptions::host_shared_params, the default): where the group frees
// everything after forward and its shard ranks share a host, the unsharded
// parameters live once per host in a shared-memory window, and a gather is each rank writing
// its rows there (only when its shards changed) and waiting for the others': no copy-out, and
// "freeing" after forward only releases this rank's use of the window.
//
// Prefetch (set_modules_to_forward/backward_prefetch): a group's unshard also issues the
// next groups' all-gathers asynchronously; they are waited on when those groups unshard, so
// the communication overlaps this group's compute. A prefetched buffer is used only if no
// shard changed since it was issued (version counters), else it is gathered again.
//
// Backward (one entry point per group, DESIGN.md invariant 2): the group's gradients
// arrive together; each is copied, cast to reduce_dtype, into one flat contiguous padded
// buffer and reduce-scattered (avg) over the shard dim asynchronously, so it overlaps the
// next group's backward. It is finished when the next group reduces (one in flight) or
// when backward ends (an autograd end-of-backward callback): all-reduced (avg) over the
// replicate dim (HSDP) and written (accumulated) as the sharded .grad. Every collective is tagged
// with the group's FQNs. With set_requires_gradient_sync(false), gradients accumulate unsharded and
// unreduced; the next synced backward reduces the sum once.
//
// A group of one shard rank without replication, fp32 and no divide factor (a one-rank world,
// a pipeline stage with dp 1) gathers and reduces nothing: its parameters stay autograd
// leaves used directly by forward, the specs are still set, and no hook is installed.
//
// Under DeviceContext(meta) (or with meta parameters) nothing is communicated: specs are
// set and the local shards are meta tensors of their shard shape, ready for to_empty +
// init_weights.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyperpar/mesh/device_mesh.h"
#include "hyperpar/nn/module.h"

namespace hyperpar::parallel {

/// How a group's parameters are communicated. kPerParam: one all-gather and one
/// reduce-scatter per parameter, straight into the parameter's unsharded storage and out of
/// its gradient, where every parameter of the group is sharded on dim 0 into equal chunks;
/// otherwise (and with kPerGroup) one of each per group over a flat buffer (FSDP2's layout),
/// copied out into the unsharded parameters and in from the gradients. Same bytes and
/// results either way; per parameter saves two passes over the unsharded group per gather
/// and one per reduction (FSDP8 on 8 ranks sharing 2 cores: 13% less CPU per step on MPI,
/// 3% on gloo, where each collective costs more to issue).
enum class FSDPCollectives { kPerParam, kPerGroup };

struct FSDPOptions {
  FSDPCollectives collectives = FSDPCollectives::kPerParam;
  /// Where the group frees everything after forward (reshard_to 0) and its shard ranks share
  /// a host with shared memory on (any shard dim, padded or not): the unsharded parameters live
  /// once per host, in a shared-memory window of the shard group (comm/host_window.h), and
  /// every rank computes on them in place. An all-gather becomes: this rank writes its shard
  /// there (only when it changed since it last did, e.g. after an optimizer step), then waits
  /// until every rank has; no rank copies the other shards out, and nothing is allocated or
  /// freed per step. Memory: the group's unsharded parameters stay resident, once per host
  /// (not once per rank), for the group's life, where the private path holds them once per
  /// rank while in use; off (false) keeps that per-rank behaviour. Results are bit-identical
  /// either way.
  bool host_shared_params = true;
  bool reshard_after_forward = true;
  /// With reshard_after_forward: 0 frees everything (backward all-gathers over the whole
  /// shard group); k (dividing the shard group size, e.g. the ranks of one node) keeps
  /// 1/k of the unsharded parameters per rank, shared by groups of k consecutive shard
  /// ranks, so backward all-gathers only within those k ranks (FSDP2's int
  /// reshard_after_forward). k = 1 keeps everything (no reshard).
  int64_t reshard_to = 0;
  c10::ScalarType param_dtype = c10::kFloat;   // all-gather and compute
  c10::ScalarType reduce_dtype = c10::kFloat;  // gradient reduction
  /// When set, gradients are summed (reduce-scatter and HSDP all-reduce) and divided by this
  /// once, instead of averaged over the group (PyTorch's set_gradient_divide_factor). Expert
  /// FSDP groups need it: parallel/expert_mesh.h.
  std::optional<double> gradient_divide_factor;
  /// The dim each parameter is sharded on, given its FQN and the parameter as it is when
  /// fully_shard runs (TP/EP-distributed already: `data` has the TP/EP-local shape, on meta
  /// too). Unset, or nullopt for a parameter: dim 0. The dim must exist.
  std::function<std::optional<int64_t>(const std::string& fqn, const nn::Parameter& p)>
      shard_placement_fn;
};

struct FSDPStats {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;
  int64_t prefetched = 0;                  // all-gathers (counted above) issued early and consumed
  int64_t post_forward_group_gathers = 0;  // refills within the reshard_to group
  /// Gradients that reached the reduction entry point as non-contiguous views (transposed
  /// or strided autograd results); each was copied into the flat buffer like any other.
  int64_t noncontiguous_grads = 0;
  /// Communication buffers allocated, once; later steps reuse them. Per group: 4 (send and
  /// receive of the flat all-gather and reduce-scatter); per parameter: 2 (the shards'
  /// all-gather send and the reduced shards), the others being the parameters' own storage.
  int64_t buffer_allocations = 0;
  /// Reduced shards that became their parameter's gradient as a view of the receive buffer
  /// (no copy): where the parameter had no gradient yet and its dtype is the reduce dtype.
  /// A receive buffer that gradients still view at the next reduction (not zeroed, e.g.
  /// gradients accumulated over several synced backwards) is left to them and a new one made.
  int64_t grads_viewing_buffer = 0;
  /// The group communicates per parameter (FSDPCollectives::kPerParam and a layout that
  /// allows it); known from its first gather or reduction.
  bool per_param_collectives = false;
  /// The group's unsharded parameters are host-shared (FSDPOptions::host_shared_params);
  /// known from its first gather. Its all-gathers are counted above, and of them:
  bool host_shared_params = false;
  int64_t host_window_writes = 0;  // gathers that wrote this rank's shard (it had changed)
};

class FSDPGroup;

/// The least bytes per step (comm/traffic.h's per-rank measure) a group's layout needs, per
/// op, and the traffic scope its collectives are counted under. For Psi parameters (TP-local
/// elements) on N shard ranks, R replicas, k = the post-forward group size (N by default):
///   all_gather_into_tensor  forwards x (N-1)/N Psi b_param  (+ (k-1)/k Psi b_param for the
///                           backward refill with reshard_after_forward); 1 x with explicit
///                           unshard (pipelines)
///   reduce_scatter_tensor   (N-1)/N Psi b_reduce   (gradients are reduced once per step)
///   all_reduce              2 (R-1)/R Psi/N b_reduce (HSDP only)
struct FSDPTrafficBound {
  std::string scope;
  std::vector<std::pair<std::string, double>> bytes_per_op;
};

/// The group created by fully_shard(module); nullptr if the module was not fully_shard-ed.
class FSDPHandle {
 public:
  explicit FSDPHandle(std::shared_ptr<FSDPGroup> g) : group_(std::move(g)) {}
  void set_requires_gradient_sync(bool sync);
  /// FSDP2's explicit prefetch: when this group unshards in forward, the all-gathers of
  /// `next` are issued asynchronously and waited on only when those groups unshard, so the
  /// communication overlaps this group's compute. Every rank must set the same lists.
  void set_modules_to_forward_prefetch(const std::vector<FSDPHandle>& next);
  /// The same in backward: when this group is refilled before its backward, the refill
  /// all-gathers of `next` (groups resharded after forward) are issued early.
  void set_modules_to_backward_prefetch(const std::vector<FSDPHandle>& next);
  const FSDPStats& stats() const;
  void reset_stats();
  /// Explicit unshard, FSDP2's unshard() as pipeline schedules use it: one all-gather, after
  /// which the group stays unsharded for every forward (no per-forward gather, no reshard
  /// after forward) until reshard(). The unsharded parameters are autograd leaves, so the
  /// gradients of all microbatches accumulate there; reduce_grad() hands their sum to the
  /// group's one reduction entry point (one reduce-scatter, honouring
  /// set_requires_gradient_sync), issued asynchronously: wait_gradient_reductions() finishes
  /// it. Without a preceding unshard() both are no-ops.
  ///   for (auto& h : stage_groups) h.unshard();
  ///   ... forward and backward of every microbatch ...
  ///   for (auto& h : stage_groups) { h.reduce_grad(); h.reshard(); }
  ///   wait_gradient_reductions();
  void unshard();
  void reduce_grad();
  void reshard();
  const std::vector<std::string>& fqns() const;
  /// See FSDPTrafficBound; `forwards` forward passes per step (gradient accumulation
  /// micro-batches), `explicit_unshard` under a pipeline schedule.
  FSDPTrafficBound traffic_lower_bound(int64_t forwards, bool explicit_unshard) const;

 private:
  std::shared_ptr<FSDPGroup> group_;
};

/// The dim of a (TP-local) shape to shard over n ranks with the least padding: dim 0 when it
/// divides by n (FSDP2's default), else the dim whose padded size (largest torch.chunk part x
/// n x the other dims) is smallest, the lowest dim on a tie.
///   least_padded_dim({2, 704, 512}, 4) -> 1     least_padded_dim({4, 704, 512}, 4) -> 0
///   least_padded_dim({4, 512}, 8) -> 1 (a router)   least_padded_dim({3}, 2) -> 0
int64_t least_padded_dim(const std::vector<int64_t>& shape, int64_t n);

/// Finishes every reduce-scatter still in flight (after reduce_grad outside autograd).
void wait_gradient_reductions();

/// Applies FSDP to `module` (see above); `dp_mesh` is 1-D (shard) or 2-D (replicate, shard).
FSDPHandle fully_shard(nn::Module& module, const mesh::DeviceMesh& dp_mesh,
                       const FSDPOptions& opts = {}, const std::string& fqn_prefix = "");

}  // namespace hyperpar::parallel
