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

// A gather of the window: complete once every rank has published its epoch. Like the
// all-gather it replaces (comm/communicator.cpp), it is registered with the collective watchdog
// (comm/watchdog.h) until then, so that a stopped or hung peer is reported naming the group,
// and when profiling it is on the "collectives in flight" track from issue to completion, its
// blocking wait on the main track.
class WindowWork final : public comm::Work {
 public:
  WindowWork(std::shared_ptr<comm::HostWindow> window, uint32_t epoch, const std::string& what,
             std::string detail)
      : window_(std::move(window)),
        epoch_(epoch),
        watch_(comm::watch_begin(what)),
        traced_(profile::enabled()),
        detail_(std::move(detail)),
        began_(traced_ ? profile::now_us() : 0) {}
  ~WindowWork() override { end(); }
  void wait() override {
    const int64_t t0 = traced_ ? profile::now_us() : 0;
    window_->wait_published(epoch_);
    if (traced_)
      profile::complete("wait all_gather_into_tensor", "comm", t0, profile::now_us(),
                        profile::kMain, detail_);
    end();
  }
  bool is_completed() override {
    if (!window_->published_by_all(epoch_)) return false;
    end();
    return true;
  }

 private:
  void end() {
    if (watch_) comm::watch_end(watch_);
    watch_ = 0;
    if (traced_)
      profile::complete("all_gather_into_tensor", "comm", began_, profile::now_us(), profile::kComm,
                        detail_);
    traced_ = false;
  }
  std::shared_ptr<comm::HostWindow> window_;
  uint32_t epoch_;
  uint64_t watch_;
  bool traced_;
  std::string detail_;
  int64_t began_;
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
    // How the watchdog and the profiler name the group (as comm/communicator.cpp does).
    window_group = shard_group->label();
    if (window_group.find("ranks [") == std::string::npos) {
      window_group += " ranks [";
      for (size_t r = 0; r < shard_group->ranks().size(); ++r)
        window_group += (r ? ", " : "") + std::to_string(shard_group->ranks()[r]);
      window_group += "]";
    }
    window_group += " (host window)";
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
  const std::string what = "all_gather_into_tensor on " + window_group + ", tag '" + tag + "'";
  if (current != window_written) {
    profile::Span span("fsdp", [&] { return "host window write " + traffic_scope; });
    {
      comm::WatchScope watched(what + ", waiting for the peers to release the previous epoch");
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
  pg.works.push_back(
      std::make_shared<WindowWork>(window, epoch, what, tag + " on " + window_group));
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
