#pragma once
// FSDPGroup: the state of one fully_shard parameter group (internal to parallel/; the public
// API is parallel/fsdp.h). Gathering (flat all-gather, prefetch, post-forward resharding),
// the single gradient-reduction entry point, and the explicit unshard used by pipeline
// schedules all operate on it.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/engine.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/profiler.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/parallel/fsdp.h"

namespace hyperpar::parallel {

using dtensor::chunk_range;

class FSDPGroup : public std::enable_shared_from_this<FSDPGroup> {
 public:
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

  // Ranks that share a post-forward shard: reshard_to consecutive shard coordinates.
  int64_t post_forward_size() const { return opts.reshard_to > 0 ? opts.reshard_to : dp; }

  void ensure_groups() {
    if (shard_group) return;
    shard_group = dp_mesh->get_group(dp_mesh->ndim() - 1);
    if (dp_mesh->ndim() == 2 && dp_mesh->size(0) > 1) replicate_group = dp_mesh->get_group(0);
    const int64_t k = post_forward_size();
    if (k > 1 && k < dp) {
      const auto all = dp_mesh->group_ranks(dp_mesh->ndim() - 1);
      const auto first = all.begin() + (coord / k) * k;
      std::vector<int64_t> block(first, first + k);
      std::string label = "fsdp post-forward ranks [";
      for (size_t i = 0; i < block.size(); ++i) label += (i ? ", " : "") + std::to_string(block[i]);
      reshard_group = dp_mesh->world()->group(block, label + "]");
    }
  }
  FSDPOptions opts;
  std::string tag;
  std::string traffic_scope;  // "fsdp <module>" (comm/traffic.h)
  bool trivial = false;       // one rank, nothing to gather or reduce (fully_shard)
  std::vector<at::Tensor> unsharded;
  std::vector<at::Tensor> grad_acc;
  bool sync = true, freed = false;
  FSDPStats stats;

  int64_t rows(size_t i, int64_t r) const { return chunk_range(full_local[i][dim[i]], dp, r).size; }
  // The shape of n rows of param i: its chunk as a contiguous tensor in a flat segment.
  std::vector<int64_t> chunk_shape(size_t i, int64_t n) const {
    std::vector<int64_t> s = full_local[i];
    s[dim[i]] = n;
    return s;
  }

  // Per-parameter collectives (FSDPOptions::collectives): where every parameter is split on
  // dim 0 into equal chunks, rank r's chunk of a parameter is rows [r * n, (r + 1) * n) of
  // the unsharded tensor, which is exactly where an all-gather of that parameter alone puts
  // it and where a reduce-scatter of its gradient alone reads it. So each parameter is
  // gathered straight into its unsharded storage and reduced straight from its gradient:
  // no copy-out and no reduce copy-in (two passes over the unsharded group per gather, one
  // per reduction), for one collective per parameter instead of one per group.
  std::optional<bool> per_param_cache;
  bool per_param() {
    if (per_param_cache) return *per_param_cache;
    bool even = post_forward_size() == dp && !params.empty();
    for (size_t i = 0; i < params.size() && even; ++i)
      even = dim[i] == 0 && !full_local[i].empty() && full_local[i][0] % dp == 0 &&
             full_local[i][0] > 0;
    per_param_cache = even && opts.collectives == FSDPCollectives::kPerParam;
    stats.per_param_collectives = *per_param_cache;
    return *per_param_cache;
  }

  // A prefetched all-gather in flight: its buffers and the shards' versions when issued.
  // Per parameter: one work per parameter, each writing dst[i] (fresh tensors for a
  // forward, the freed unsharded storage for a refill).
  struct PendingGather {
    std::vector<comm::WorkHandle> works;
    at::Tensor send, recv;
    std::vector<int64_t> versions;
    bool from_kept;
    std::vector<at::Tensor> dst;
    bool into_freed = false;
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

  // Flat communication buffers, kept between steps (CPU tensors are not cached by an
  // allocator: a fresh one per call costs its page faults every time). A group has at most
  // one all-gather and one reduce-scatter in flight, and each buffer is consumed (copied out)
  // before the next call of its kind on the group, so one of each suffices.
  // The send buffers are zeroed once, when allocated: every copy-in writes the same
  // parameter rows at the same offsets each time, so their padding is never written and stays
  // zero (a backend that reduced into a send buffer would sum zeros there too). Zeroing the
  // whole buffer before every call cost 2-3% of an 8-rank step's CPU time.
  at::Tensor gather_send, gather_recv, reduce_send, reduce_recv;
  at::Tensor& reused(at::Tensor& buf, int64_t numel, c10::ScalarType dtype) {
    if (!buf.defined() || buf.numel() != numel || buf.scalar_type() != dtype) {
      buf = at::zeros({numel}, at::TensorOptions().dtype(dtype));
      ++stats.buffer_allocations;
    }
    return buf;
  }

  std::vector<int64_t> shard_versions() const {
    std::vector<int64_t> v;
    for (auto* p : params) v.push_back(static_cast<int64_t>(p->data._version()));
    return v;
  }

  // Issues the flat all-gather without waiting: of every shard (padded, cast to
  // param_dtype) over the shard group, or of the post-forward chunks over the reshard group.
  void begin_gather(bool from_kept = false) {
    if (pending || trivial) return;
    comm::TrafficScope scope(traffic_scope);
    at::Tensor send;
    ensure_groups();
    auto group = shard_group;
    if (from_kept) {
      send = kept;
      group = reshard_group;
    } else {
      profile::Span span("fsdp", [&] { return "copy-in " + traffic_scope; });
      send = reused(gather_send, segment, opts.param_dtype);
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& shard = params[i]->data;
        if (shard.numel() > 0)
          send.narrow(0, offset[i], shard.numel()).copy_(shard.detach().reshape({-1}));
      }
    }
    if (!from_kept && per_param()) {
      PendingGather pg{{}, send, at::Tensor(), shard_versions(), false, {}, freed};
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor dst;
        if (freed) {
          dst = regrown_alias(i);  // backward refill
        } else {
          dst = at::empty(full_local[i], at::TensorOptions().dtype(opts.param_dtype));
        }
        const int64_t n = params[i]->data.numel();
        pg.works.push_back(group->all_gather_into_tensor(
            dst.view({-1}), send.narrow(0, offset[i], n), {tag, true}));
        pg.dst.push_back(dst);
      }
      ++stats.all_gathers;
      pending = std::move(pg);
      return;
    }
    at::Tensor recv = reused(gather_recv, dp * segment, opts.param_dtype);
    auto work = group->all_gather_into_tensor(recv, send, {tag, true});
    ++stats.all_gathers;
    if (from_kept) ++stats.post_forward_group_gathers;
    pending = PendingGather{{work}, send, recv, shard_versions(), from_kept, {}, false};
  }

  // Per parameter: waits for the gather (prefetched if still current, else issued now)
  // and returns the tensors it wrote.
  std::vector<at::Tensor> gather_per_param() {
    if (pending) {
      pending->wait();
      if (pending->versions == shard_versions() && !pending->from_kept &&
          pending->into_freed == freed && !pending->dst.empty())
        ++stats.prefetched;
      else
        pending.reset();
    }
    if (!pending) begin_gather();
    pending->wait();
    auto dst = std::move(pending->dst);
    pending.reset();
    return dst;
  }

  // The gathered [dp * segment] buffer: the prefetched one if it is still current (no shard
  // changed since it was issued, e.g. by an optimizer step), else a fresh all-gather.
  at::Tensor gather_flat(bool from_kept = false) {
    if (pending) {
      pending->wait();
      if (pending->versions == shard_versions() && pending->from_kept == from_kept &&
          pending->dst.empty())
        ++stats.prefetched;
      else
        pending.reset();  // stale: a shard was updated after it was issued
    }
    if (!pending) begin_gather(from_kept);
    pending->wait();
    at::Tensor flat = pending->recv;
    pending.reset();
    return flat;
  }

  void prefetch(const std::vector<std::weak_ptr<FSDPGroup>>& targets, bool only_freed) {
    for (const auto& w : targets)
      if (auto t = w.lock())
        if (!only_freed || t->freed) t->begin_gather(only_freed && t->kept.defined());
  }

  // Rank r's rows of param i inside the gathered buffer, concatenated over ranks along the
  // sharded dim (for a dim > 0 each chunk lands as a strided block of dst).
  void copy_out(const at::Tensor& flat, size_t i, at::Tensor dst) {
    int64_t row = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const int64_t n = rows(i, r);
      if (n == 0) continue;
      dst.narrow(dim[i], row, n)
          .copy_(flat.narrow(0, r * segment + offset[i], n * row_numel[i]).view(chunk_shape(i, n)));
      row += n;
    }
  }

  std::vector<at::Tensor> unshard_new() {
    if (per_param()) return gather_per_param();
    at::Tensor flat = gather_flat();
    profile::Span span("fsdp", [&] { return "copy-out " + traffic_scope; });
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor t = at::empty(full_local[i], at::TensorOptions().dtype(opts.param_dtype));
      copy_out(flat, i, t);
      out.push_back(t);
    }
    return out;
  }

  // Rows of param i that shard rank r holds start at this row of the unsharded tensor.
  int64_t first_row(size_t i, int64_t r) const {
    int64_t row = 0;
    for (int64_t q = 0; q < r; ++q) row += rows(i, q);
    return row;
  }

  void free_unsharded() {
    const int64_t k = post_forward_size();
    if (k < dp) {
      const int64_t per = dp / k, j = coord % k;
      kept = at::zeros({per * segment}, at::TensorOptions().dtype(opts.param_dtype));
      for (int64_t r = j * per; r < (j + 1) * per; ++r)
        for (size_t i = 0; i < params.size(); ++i) {
          const int64_t n = rows(i, r);
          if (n == 0) continue;
          kept.narrow(0, (r - j * per) * segment + offset[i], n * row_numel[i])
              .view(chunk_shape(i, n))
              .copy_(unsharded[i].detach().narrow(dim[i], first_row(i, r), n));
        }
    }
    for (auto& t : unsharded) at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), 0);
    freed = true;
  }

  // Param i's freed unsharded storage regrown in place (saved tensors alias it), as a fresh
  // alias to write through, so the autograd version counter is untouched.
  at::Tensor regrown_alias(size_t i) {
    at::Tensor& t = unsharded[i];
    at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), t.numel() * t.element_size());
    return at::from_blob(t.data_ptr(), t.sizes(), t.options());
  }

  // Refill freed storage in place.
  void refill() {
    if (!freed) return;
    if (per_param()) {
      gather_per_param();
      freed = false;
      return;
    }
    at::Tensor flat = gather_flat(kept.defined());
    profile::Span span("fsdp", [&] { return "copy-out (refill) " + traffic_scope; });
    kept = at::Tensor();
    for (size_t i = 0; i < params.size(); ++i) copy_out(flat, i, regrown_alias(i));
    freed = false;
  }

  // Explicit unshard (pipeline schedules, FSDPHandle::unshard): the unsharded parameters are
  // autograd leaves that every forward uses until release_held(); gradients of all
  // microbatches accumulate on them and reach reduce_grads once, through reduce_held().
  bool held = false;
  void hold() {
    if (held || params.empty() || trivial) return;
    HP_CHECK(unsharded.empty(), "FSDP ", tag,
             ": unshard() while a forward's unsharded parameters are still in use");
    unsharded = unshard_new();
    for (auto& t : unsharded) t.requires_grad_(true);
    held = true;
    freed = false;
  }
  void reduce_held() {
    if (!held) return;
    std::vector<at::Tensor> grads;
    for (auto& t : unsharded) {
      grads.push_back(t.grad());
      t.mutable_grad() = at::Tensor();
    }
    reduce_grads(grads, /*in_backward=*/false);
  }
  void release_held() {
    if (!held) return;
    unsharded.clear();
    held = false;
  }

  // An issued reduce-scatter: waited on when the next group reduces or backward ends; then
  // the HSDP all-reduce, the divide factor, and the sharded gradients written (added to any
  // gradient already there, as autograd accumulation would).
  struct PendingReduce {
    std::vector<comm::WorkHandle> works;
    at::Tensor send, recv;
    std::vector<at::Tensor> grads;  // per parameter: the unsharded gradients being reduced
  };
  std::optional<PendingReduce> pending_reduce;

  // The single gradient-reduction entry point: grads (any layout) -> sharded grads.
  // in_backward: called by autograd (the end-of-backward callback finishes what is in
  // flight); otherwise wait_gradient_reductions() does.
  std::vector<at::Tensor> reduce_grads(const std::vector<at::Tensor>& grads,
                                       bool in_backward = true) {
    std::vector<at::Tensor> full(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (grads[i].defined() && !grads[i].is_contiguous()) ++stats.noncontiguous_grads;
      full[i] = grads[i].defined()
                    ? grads[i].to(opts.reduce_dtype)
                    : at::zeros(full_local[i], at::TensorOptions().dtype(opts.reduce_dtype));
      if (!grad_acc.empty() && grad_acc[i].defined()) full[i] = full[i] + grad_acc[i];
    }
    std::vector<at::Tensor> out(params.size());
    if (!sync) {
      grad_acc = full;  // unreduced running sum; sharded grads stay untouched
      return out;
    }
    grad_acc.clear();
    // Copy-in: rank r's rows of every parameter at r * segment + offset (contiguous, padded),
    // into this group's kept buffer (its own previous reduce-scatter is finished by now: at
    // the end of that backward; the check keeps it so).
    if (pending_reduce) finish_reduce();
    if (per_param()) {
      at::Tensor recv = reused(reduce_recv, segment, opts.reduce_dtype);
      finish_all_reductions();  // at most one reduce-scatter in flight (bounds memory)
      comm::TrafficScope scope(traffic_scope);
      PendingReduce pr{{}, at::Tensor(), recv, {}};
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor g = full[i].contiguous();
        pr.works.push_back(shard_group->reduce_scatter_tensor(
            recv.narrow(0, offset[i], params[i]->data.numel()), g, reduce_op(), {tag, true}));
        pr.grads.push_back(g);
      }
      ++stats.reduce_scatters;
      issued_reduce(std::move(pr), in_backward);
      return out;
    }
    std::optional<profile::Span> span(std::in_place, "fsdp",
                                      [&] { return "reduce copy-in " + traffic_scope; });
    at::Tensor send = reused(reduce_send, dp * segment, opts.reduce_dtype);
    for (size_t i = 0; i < params.size(); ++i) {
      int64_t row = 0;
      for (int64_t r = 0; r < dp; ++r) {
        const int64_t n = rows(i, r);
        if (n == 0) continue;
        send.narrow(0, r * segment + offset[i], n * row_numel[i])
            .view(chunk_shape(i, n))
            .copy_(full[i].narrow(dim[i], row, n));
        row += n;
      }
    }
    at::Tensor recv = reused(reduce_recv, segment, opts.reduce_dtype);
    span.reset();
    ensure_groups();
    finish_all_reductions();  // at most one reduce-scatter in flight (bounds memory)
    comm::TrafficScope scope(traffic_scope);
    auto work = shard_group->reduce_scatter_tensor(recv, send, reduce_op(), {tag, true});
    ++stats.reduce_scatters;
    issued_reduce(PendingReduce{{work}, send, recv, {}}, in_backward);
    return out;  // undefined: finish_reduce writes the sharded gradients itself
  }

  void issued_reduce(PendingReduce pr, bool in_backward) {
    pending_reduce = std::move(pr);
    in_flight().push_back(shared_from_this());
    // Whatever is still in flight when this backward ends is finished then (FSDP2's
    // post-backward callback), so the optimizer always sees complete gradients.
    if (in_backward)
      torch::autograd::Engine::get_default_engine().queue_callback([] { finish_all_reductions(); });
  }

  comm::ReduceOp reduce_op() const {
    return opts.gradient_divide_factor ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  }

  void finish_reduce() {
    if (!pending_reduce) return;
    PendingReduce pr = std::move(*pending_reduce);
    pending_reduce.reset();
    for (auto& w : pr.works) w->wait();
    profile::Span span("fsdp", [&] { return "reduce finish " + traffic_scope; });
    if (replicate_group) {
      comm::TrafficScope scope(traffic_scope);
      replicate_group->all_reduce(pr.recv, reduce_op(), {tag, false});
      ++stats.all_reduces;
    }
    if (opts.gradient_divide_factor) pr.recv.div_(*opts.gradient_divide_factor);
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& shard = params[i]->data;
      // A view of the reused receive buffer: added in place, or copied once (with the cast).
      at::Tensor g = pr.recv.narrow(0, offset[i], shard.numel()).view(shard.sizes());
      at::Tensor& grad = shard.mutable_grad();
      if (grad.defined())
        grad.add_(g);
      else
        grad = g.to(shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    }
  }

  // Groups with a reduce-scatter in flight, in issue order (one backward thread: CPU autograd
  // runs on the caller's thread, so does the end-of-backward callback).
  static std::vector<std::weak_ptr<FSDPGroup>>& in_flight() {
    static std::vector<std::weak_ptr<FSDPGroup>> groups;
    return groups;
  }
  static void finish_all_reductions() {
    auto groups = std::move(in_flight());
    in_flight().clear();
    for (auto& w : groups)
      if (auto g = w.lock()) g->finish_reduce();
  }
};

}  // namespace hyperpar::parallel
