// FSDPGroup's gradient reduction: the single entry point (reduce_grads), reduce-scatters per
// parameter or flat, kept in flight until the next group reduces or backward ends, then the
// HSDP all-reduce and the sharded gradients (see fsdp_group.h).
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>

#include "fsdp_group.h"
#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/profiler.h"

namespace hyperpar::parallel {

std::vector<at::Tensor> FSDPGroup::reduce_grads(const std::vector<at::Tensor>& grads,
                                                bool in_backward) {
  std::vector<at::Tensor> full(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (grads[i].defined() && !grads[i].is_contiguous()) ++stats.noncontiguous_grads;
    full[i] = grads[i].defined()
                  ? grads[i].to(opts.reduce_dtype)
                  : at::zeros(full_local[i], at::TensorOptions().dtype(opts.reduce_dtype));
    if (!grad_acc.empty() && grad_acc[i].defined()) full[i] = full[i] + grad_acc[i];
  }
  std::vector<at::Tensor> out(params.size());  // undefined: finish_reduce writes the grads
  if (!sync) {
    grad_acc = full;  // unreduced running sum; sharded grads stay untouched
    return out;
  }
  grad_acc.clear();
  // This group's own previous reduce-scatter is finished by now (at the end of that
  // backward); the check keeps it so before its buffers are written again.
  if (pending_reduce) finish_reduce();
  // The previous reduction's gradients are views of its receive buffer (finish_reduce):
  // while any is alive (not zeroed yet), that buffer is theirs.
  if (reduce_recv.defined() && reduce_recv.storage().use_count() > 1) reduce_recv = at::Tensor();
  ensure_groups();
  if (per_param()) {
    at::Tensor recv = reused(reduce_recv, segment, opts.reduce_dtype);
    finish_all_reductions();  // at most one reduce-scatter in flight (bounds memory)
    comm::TrafficScope scope(traffic_scope);
    // The works hold the gradients until they are reduced; holding none here lets a
    // shared-memory reduce-scatter lend a gradient to its peers and go on without waiting
    // for them to read it (shm_arena.h).
    PendingReduce pr{{}, at::Tensor(), recv};
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = full[i].contiguous();
      full[i] = at::Tensor();
      pr.works.push_back(shard_group->reduce_scatter_tensor(
          recv.narrow(0, offset[i], params[i]->data.numel()), g, reduce_op(), {tag, true}));
    }
    ++stats.reduce_scatters;
    issued_reduce(std::move(pr), in_backward);
    return out;
  }
  // Copy-in: rank r's rows of every parameter at r * segment + offset (contiguous, padded).
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
  finish_all_reductions();  // at most one reduce-scatter in flight (bounds memory)
  comm::TrafficScope scope(traffic_scope);
  auto work = shard_group->reduce_scatter_tensor(recv, send, reduce_op(), {tag, true});
  ++stats.reduce_scatters;
  issued_reduce(PendingReduce{{work}, send, recv}, in_backward);
  return out;
}

void FSDPGroup::reduce_held() {
  if (!held) return;
  std::vector<at::Tensor> grads;
  for (auto& t : unsharded) {
    grads.push_back(t.grad());
    t.mutable_grad() = at::Tensor();
  }
  reduce_grads(grads, /*in_backward=*/false);
}

void FSDPGroup::issued_reduce(PendingReduce pr, bool in_backward) {
  pending_reduce = std::move(pr);
  in_flight().push_back(shared_from_this());
  // Whatever is still in flight when this backward ends is finished then (FSDP2's
  // post-backward callback), so the optimizer always sees complete gradients.
  if (in_backward)
    torch::autograd::Engine::get_default_engine().queue_callback([] { finish_all_reductions(); });
}

void FSDPGroup::finish_reduce() {
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
    // The reduced shard, in the receive buffer: the gradient itself where there is none yet
    // (the buffer is reused by the next reduction only once such views are gone), else added
    // in place or cast.
    at::Tensor g = pr.recv.narrow(0, offset[i], shard.numel()).view(shard.sizes());
    at::Tensor& grad = shard.mutable_grad();
    if (grad.defined()) {
      grad.add_(g);
    } else if (g.scalar_type() == shard.scalar_type()) {
      grad = g;
      ++stats.grads_viewing_buffer;
    } else {
      grad = g.to(shard.scalar_type());
    }
  }
}

std::vector<std::weak_ptr<FSDPGroup>>& FSDPGroup::in_flight() {
  static std::vector<std::weak_ptr<FSDPGroup>> groups;
  return groups;
}

void FSDPGroup::finish_all_reductions() {
  auto groups = std::move(in_flight());
  in_flight().clear();
  for (auto& w : groups)
    if (auto g = w.lock()) g->finish_reduce();
}

}  // namespace hyperpar::parallel
