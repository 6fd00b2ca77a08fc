// FSDPGroup's host-shared unsharded parameters (FSDPOptions::host_shared_params; see
// fsdp_group.h and comm/host_window.h).
//
// Why it is safe to compute on memory the other ranks write: a rank writes its rows only when
// its shards changed, i.e. after an optimizer step (or a load), and first waits until every
// other rank has released the previous epoch. A rank releases an epoch when it is done with
// the unsharded parameters (after the module's forward, after its backward, when an explicit
// unshard ends) and, at the latest, when it publishes its next epoch of the group. Within a
// step the shards do not change, so a backward's refill finds the forward's values in place.
#include <ATen/ATen.h>

#include "fsdp_group.h"
#include "hyperpar/comm/traffic.h"
#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/profiler.h"

namespace hyperpar::parallel {
namespace {

// A gather of the window: complete once every rank has published its epoch (watched and
// profiled by its communicator like the all-gather it replaces: Communicator::watched).
class WindowWork final : public comm::Work {
 public:
  WindowWork(std::shared_ptr<comm::HostWindow> window, uint32_t epoch)
      : window_(std::move(window)), epoch_(epoch) {}
  void wait() override { window_->wait_published(epoch_); }
  bool is_completed() override { return window_->published_by_all(epoch_); }

 private:
  std::shared_ptr<comm::HostWindow> window_;
  uint32_t epoch_;
};

size_t round_up_64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

bool FSDPGroup::host_shared() {
  if (host_shared_cache) return *host_shared_cache;
  // Any layout: rank r's rows of param i are rows [first_row(i, r), + rows(i, r)) of its
  // FSDP dim, a contiguous block on dim 0 and a strided one on another dim, uneven or not.
  // Not with reshard_to (the backward gathers within a smaller group, from kept chunks).
  if (opts.host_shared_params && !trivial && !params.empty() && post_forward_size() == dp) {
    ensure_groups();
    const size_t elem = c10::elementSize(opts.param_dtype);
    size_t bytes = 0;
    for (const auto& shape : full_local) {
      window_offset.push_back(bytes);
      size_t n = 1;
      for (int64_t d : shape) n *= static_cast<size_t>(d);
      bytes += round_up_64(n * elem);
    }
    window = shard_group->host_window(bytes);
    if (!window) window_offset.clear();
  }
  host_shared_cache = window != nullptr;
  stats.host_shared_params = *host_shared_cache;
  return *host_shared_cache;
}

at::Tensor FSDPGroup::window_alias(size_t i) const {
  auto keep = window;  // the tensor keeps the mapping alive, e.g. in a saved autograd graph
  return at::from_blob(
      window->data() + window_offset[i], full_local[i], [keep](void*) {},
      at::TensorOptions().dtype(opts.param_dtype));
}

void FSDPGroup::begin_window_gather() {
  comm::TrafficScope scope(traffic_scope);
  const uint32_t epoch = ++window_epoch;
  // Done with whatever this rank saw before (it is about to see this epoch's), so that peers
  // waiting to write this epoch do not wait on this rank's explicit release.
  window->release(epoch - 1);
  std::vector<std::pair<const void*, int64_t>> current;
  for (auto* p : params)
    current.emplace_back(p->data.data_ptr(), static_cast<int64_t>(p->data._version()));
  if (current != window_written) {
    profile::Span span("fsdp", [&] { return "host window write " + traffic_scope; });
    {
      comm::WatchScope watched(shard_group->watch_name(
          "all_gather_into_tensor", tag,
          " (host window), waiting for the peers to release the previous epoch"));
      window->wait_released(epoch - 1);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t n = rows(i, coord);
      if (n == 0) continue;
      window_alias(i)
          .narrow(dim[i], first_row(i, coord), n)
          .copy_(params[i]->data.detach().reshape(chunk_shape(i, n)));
    }
    window_written = std::move(current);
    ++stats.host_window_writes;
  }
  window->publish(epoch);
  PendingGather pg{{}, at::Tensor(), at::Tensor(), shard_versions(), false, {}, freed, epoch};
  pg.works.push_back(shard_group->watched(std::make_shared<WindowWork>(window, epoch),
                                          "all_gather_into_tensor", tag, " (host window)"));
  const double elem = static_cast<double>(c10::elementSize(opts.param_dtype));
  for (size_t i = 0; i < params.size(); ++i) {
    pg.dst.push_back(window_alias(i));
    // Counted as the all-gather it replaces (comm/traffic.h): what this rank makes available
    // to each peer, so the report's bound holds for either path.
    comm::record_traffic(
        "all_gather_into_tensor",
        static_cast<double>(dp - 1) * static_cast<double>(params[i]->data.numel()) * elem);
  }
  ++stats.all_gathers;
  pending = std::move(pg);
}

}  // namespace hyperpar::parallel
