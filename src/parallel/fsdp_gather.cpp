// FSDPGroup's all-gathers: per parameter or flat, prefetched, from the post-forward chunks;
// freeing and refilling the unsharded parameters; explicit unshard (see fsdp_group.h).
#include <ATen/native/Resize.h>

#include <algorithm>

#include "fsdp_group.h"
#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/profiler.h"

namespace hyperpar::parallel {

void FSDPGroup::begin_gather(bool from_kept) {
  if (pending || trivial) return;
  if (!from_kept && host_shared()) {
    begin_window_gather();
    return;
  }
  comm::TrafficScope scope(traffic_scope);
  at::Tensor send;
  ensure_groups();
  auto group = shard_group;
  // Per parameter and without a cast, each shard is its own all-gather's input: no copy-in
  // (the shards stay unmodified while a gather is in flight: prefetches are issued within a
  // forward or backward, and one whose shards changed is discarded by settle_prefetch; the
  // work keeps its input alive, communicator.h).
  const bool shards_as_input =
      !from_kept && per_param() && std::all_of(params.begin(), params.end(), [&](const auto& p) {
        return p->data.scalar_type() == opts.param_dtype;
      });
  if (from_kept) {
    send = kept;
    group = reshard_group;
  } else if (!shards_as_input) {
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
      at::Tensor dst = freed
                           ? regrown_alias(i)  // backward refill
                           : at::empty(full_local[i], at::TensorOptions().dtype(opts.param_dtype));
      const int64_t n = params[i]->data.numel();
      at::Tensor in =
          shards_as_input ? params[i]->data.detach().reshape({-1}) : send.narrow(0, offset[i], n);
      pg.works.push_back(group->all_gather_into_tensor(dst.view({-1}), in, {tag, true}));
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

void FSDPGroup::settle_prefetch(bool from_kept, bool per_param_dst) {
  if (!pending) return;
  pending->wait();
  const bool same_kind = pending->from_kept == from_kept && pending->dst.empty() != per_param_dst &&
                         (!per_param_dst || pending->into_freed == freed);
  if (same_kind && pending->versions == shard_versions())
    ++stats.prefetched;
  else
    pending.reset();
}

std::vector<at::Tensor> FSDPGroup::gather_per_param() {
  settle_prefetch(/*from_kept=*/false, /*per_param_dst=*/true);
  if (!pending) begin_gather();
  pending->wait();
  auto dst = std::move(pending->dst);
  used_epoch = pending->epoch;
  pending.reset();
  return dst;
}

at::Tensor FSDPGroup::gather_flat(bool from_kept) {
  settle_prefetch(from_kept, /*per_param_dst=*/false);
  if (!pending) begin_gather(from_kept);
  pending->wait();
  at::Tensor flat = pending->recv;
  pending.reset();
  return flat;
}

void FSDPGroup::prefetch(const std::vector<std::weak_ptr<FSDPGroup>>& targets, bool only_freed) {
  for (const auto& w : targets)
    if (auto t = w.lock())
      if (!only_freed || t->freed) t->begin_gather(only_freed && t->kept.defined());
}

void FSDPGroup::copy_out(const at::Tensor& flat, size_t i, at::Tensor dst) {
  int64_t row = 0;
  for (int64_t r = 0; r < dp; ++r) {
    const int64_t n = rows(i, r);
    if (n == 0) continue;
    dst.narrow(dim[i], row, n)
        .copy_(flat.narrow(0, r * segment + offset[i], n * row_numel[i]).view(chunk_shape(i, n)));
    row += n;
  }
}

std::vector<at::Tensor> FSDPGroup::unshard_new() {
  if (host_shared() || per_param()) return gather_per_param();
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

void FSDPGroup::free_unsharded() {
  if (window) {  // nothing of this rank's own to free: the window stays, once per host
    window->release(used_epoch);
    freed = true;
    return;
  }
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

at::Tensor FSDPGroup::regrown_alias(size_t i) {
  at::Tensor& t = unsharded[i];
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), t.numel() * t.element_size());
  return at::from_blob(t.data_ptr(), t.sizes(), t.options());
}

void FSDPGroup::refill() {
  if (!freed) return;
  if (host_shared() || per_param()) {
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

void FSDPGroup::hold() {
  if (held || params.empty() || trivial) return;
  HP_CHECK(unsharded.empty(), "FSDP ", tag,
           ": unshard() while a forward's unsharded parameters are still in use");
  unsharded = unshard_new();
  for (auto& t : unsharded) t.requires_grad_(true);
  held = true;
  freed = false;
}

void FSDPGroup::release_held() {
  if (!held) return;
  drop_unsharded();
  held = false;
}

void FSDPGroup::drop_unsharded() {
  unsharded.clear();
  if (window) window->release(used_epoch);
}

}  // namespace hyperpar::parallel
