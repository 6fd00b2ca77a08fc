#pragma once
// FSDPGroup: the state of one fully_shard parameter group (internal to parallel/; the public
// API is parallel/fsdp.h). Its operations live in one file per concept:
//   fsdp_group.cpp   layout and process groups, the kept communication buffers;
//   fsdp_gather.cpp  all-gathers (per parameter or flat), prefetch, post-forward resharding,
//                    freeing and refilling the unsharded parameters, explicit unshard;
//   fsdp_reduce.cpp  the single gradient-reduction entry point and reduce-scatters in flight;
//   fsdp_host_window.cpp  host-shared unsharded parameters (FSDPOptions::host_shared_params).
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperpar/comm/communicator.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/parallel/fsdp.h"

namespace hyperpar::parallel {

class FSDPGroup : public std::enable_shared_from_this<FSDPGroup> {
 public:
  // ---- layout (fsdp_group.cpp) ----
  std::vector<nn::Parameter*> params;
  std::vector<std::string> fqns;
  std::vector<std::vector<int64_t>> full_local;  // TP-local (unsharded by FSDP) shape
  // Per param: the dim FSDP shards (a "row" is one index of it), the elements of one row,
  // the largest chunk's rows, and the param's offset into a rank's segment.
  std::vector<int64_t> dim, row_numel, max_rows, offset;
  int64_t segment = 0;  // padded elements per rank
  std::shared_ptr<comm::Communicator> shard_group, replicate_group;
  std::optional<mesh::DeviceMesh> dp_mesh;  // groups are fetched at first use (dry runs never)
  int64_t dp = 1, coord = 0;
  std::shared_ptr<comm::Communicator> reshard_group;  // post-forward group (reshard_to)
  FSDPOptions opts;
  std::string tag;
  std::string traffic_scope;  // "fsdp <module>" (comm/traffic.h)
  bool trivial = false;       // one rank, nothing to gather or reduce (fully_shard)
  std::vector<at::Tensor> unsharded;
  std::vector<at::Tensor> grad_acc;
  bool sync = true, freed = false;
  FSDPStats stats;

  // Ranks that share a post-forward shard: reshard_to consecutive shard coordinates.
  int64_t post_forward_size() const { return opts.reshard_to > 0 ? opts.reshard_to : dp; }
  void ensure_groups();
  int64_t rows(size_t i, int64_t r) const {
    return dtensor::chunk_range(full_local[i][dim[i]], dp, r).size;
  }
  // Rows of param i that shard rank r holds start at this row of the unsharded tensor.
  int64_t first_row(size_t i, int64_t r) const;
  // The shape of n rows of param i: its chunk as a contiguous tensor in a flat segment.
  std::vector<int64_t> chunk_shape(size_t i, int64_t n) const;
  std::vector<int64_t> shard_versions() const;

  // Per-parameter collectives (FSDPOptions::collectives): where every parameter is split on
  // dim 0 into equal chunks, rank r's chunk of a parameter is rows [r * n, (r + 1) * n) of
  // the unsharded tensor, which is exactly where an all-gather of that parameter alone puts
  // it and where a reduce-scatter of its gradient alone reads it. So each parameter is
  // gathered straight into its unsharded storage and reduced straight from its gradient:
  // no copy-out and no reduce copy-in (two passes over the unsharded group per gather, one
  // per reduction), for one collective per parameter instead of one per group.
  bool per_param();
  std::optional<bool> per_param_cache;

  // Flat communication buffers, kept between steps (CPU tensors are not cached by an
  // allocator: a fresh one per call costs its page faults every time). A group has at most
  // one all-gather and one reduce-scatter in flight, and each buffer is consumed (copied out)
  // before the next call of its kind on the group, so one of each suffices.
  // The send buffers are zeroed once, when allocated: every copy-in writes the same
  // parameter rows at the same offsets each time, so their padding is never written and stays
  // zero (a backend that reduced into a send buffer would sum zeros there too). Zeroing the
  // whole buffer before every call cost 2-3% of an 8-rank step's CPU time.
  at::Tensor gather_send, gather_recv, reduce_send, reduce_recv;
  at::Tensor& reused(at::Tensor& buf, int64_t numel, c10::ScalarType dtype);

  // ---- gathering (fsdp_gather.cpp) ----
  // A prefetched all-gather in flight: its buffers and the shards' versions when issued.
  // Per parameter: one work per parameter, each writing dst[i] (fresh tensors for a
  // forward, the freed unsharded storage for a refill); host-shared: one work, dst[i] the
  // parameters in the window.
  struct PendingGather {
    std::vector<comm::WorkHandle> works;
    at::Tensor send, recv;
    std::vector<int64_t> versions;
    bool from_kept;
    std::vector<at::Tensor> dst;
    bool into_freed = false;
    uint32_t epoch = 0;  // host-shared: the window epoch it published
    void wait() {
      for (auto& w : works) w->wait();
    }
  };
  // With reshard_to = k < dp: after forward this rank keeps the padded segments of dp / k
  // shard ranks (its position j = coord % k picks segments [j * dp/k, (j+1) * dp/k)), so
  // the k ranks of its post-forward group hold the whole flat buffer between them.
  at::Tensor kept;
  std::optional<PendingGather> pending;
  std::vector<std::weak_ptr<FSDPGroup>> forward_prefetch, backward_prefetch;

  // Issues the all-gather without waiting: of every shard (cast to param_dtype) over the
  // shard group, or of the post-forward chunks over the reshard group.
  void begin_gather(bool from_kept = false);
  void prefetch(const std::vector<std::weak_ptr<FSDPGroup>>& targets, bool only_freed);
  // Fresh unsharded parameters (forward), gathered.
  std::vector<at::Tensor> unshard_new();
  // After forward: frees the unsharded storage (keeping the post-forward chunks, if any).
  void free_unsharded();
  // Refills freed unsharded storage in place (backward).
  void refill();

  // Explicit unshard (pipeline schedules, FSDPHandle::unshard): the unsharded parameters are
  // autograd leaves that every forward uses until release_held(); gradients of all
  // microbatches accumulate on them and reach reduce_grads once, through reduce_held().
  bool held = false;
  void hold();
  void release_held();

  // Done with the unsharded parameters (after backward, or a forward without gradients).
  void drop_unsharded();

  // ---- host-shared unsharded parameters (fsdp_host_window.cpp) ----
  // The group's unsharded parameters live in a shared-memory window of the shard group
  // (param i at window_offset[i] bytes, full_local[i] in param_dtype); a gather is an epoch
  // of it: this rank writes its rows of every parameter when its shards changed since it
  // last wrote them, publishes, and the gather's work waits until every rank has. Decided at
  // the first gather, the same on every rank (creating the window is collective).
  bool host_shared();
  std::optional<bool> host_shared_cache;
  std::shared_ptr<comm::HostWindow> window;
  std::vector<size_t> window_offset;
  uint32_t window_epoch = 0;  // the last epoch this rank published
  uint32_t used_epoch = 0;    // the epoch whose data `unsharded` shows
  std::vector<std::pair<const void*, int64_t>>
      window_written;  // shards last written (ptr, version)
  void begin_window_gather();
  // Param i's unsharded tensor in the window (a fresh alias: its own version counter).
  at::Tensor window_alias(size_t i) const;

  // ---- gradient reduction (fsdp_reduce.cpp) ----
  // An issued reduce-scatter: waited on when the next group reduces or backward ends; then
  // the HSDP all-reduce, the divide factor, and the sharded gradients written (added to any
  // gradient already there, as autograd accumulation would).
  struct PendingReduce {
    std::vector<comm::WorkHandle> works;
    at::Tensor send, recv;
  };
  std::optional<PendingReduce> pending_reduce;

  // The single gradient-reduction entry point: grads (any layout) -> sharded grads.
  // in_backward: called by autograd (the end-of-backward callback finishes what is in
  // flight); otherwise wait_gradient_reductions() does.
  std::vector<at::Tensor> reduce_grads(const std::vector<at::Tensor>& grads,
                                       bool in_backward = true);
  void reduce_held();
  void finish_reduce();
  // Finishes every group's reduce-scatter in flight, in issue order.
  static void finish_all_reductions();

 private:
  // Waits for a prefetched all-gather and keeps it if it is what the caller is about to
  // issue (same source, same destinations) and still current: no shard changed since it was
  // issued, e.g. by an optimizer step. Otherwise drops it.
  void settle_prefetch(bool from_kept, bool per_param_dst);
  std::vector<at::Tensor> gather_per_param();
  // The gathered [dp * segment] buffer.
  at::Tensor gather_flat(bool from_kept = false);
  // Rank r's rows of param i inside the gathered buffer, concatenated over ranks along the
  // sharded dim (for a dim > 0 each chunk lands as a strided block of dst).
  void copy_out(const at::Tensor& flat, size_t i, at::Tensor dst);
  // Param i's freed unsharded storage regrown in place (saved tensors alias it), as a fresh
  // alias to write through, so the autograd version counter is untouched.
  at::Tensor regrown_alias(size_t i);

  void issued_reduce(PendingReduce pr, bool in_backward);
  comm::ReduceOp reduce_op() const {
    return opts.gradient_divide_factor ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  }
  // Groups with a reduce-scatter in flight, in issue order (one backward thread: CPU autograd
  // runs on the caller's thread, so does the end-of-backward callback).
  static std::vector<std::weak_ptr<FSDPGroup>>& in_flight();
};

}  // namespace hyperpar::parallel
