#include "hyperpar/comm/communicator.h"

#include <algorithm>
#include <sstream>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/profiler.h"

namespace hyperpar::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

Communicator::Communicator(std::vector<int64_t> ranks, int64_t global_rank, std::string label)
    : ranks_(std::move(ranks)), label_(std::move(label)) {
  auto it = std::find(ranks_.begin(), ranks_.end(), global_rank);
  HP_CHECK(it != ranks_.end(), "rank ", global_rank, " is not a member of group ", label_);
  group_rank_ = it - ranks_.begin();
}

void Communicator::add_label(const std::string& label) {
  if (label_.find(label) == std::string::npos) label_ += " | " + label;
}

CallSite Communicator::site(const char* op, const CollectiveOptions& opts) const {
  return CallSite{op, label_ + " (" + backend_name() + ")", opts.tag};
}

namespace {

double bytes_of(const at::Tensor& t) { return static_cast<double>(t.numel() * t.element_size()); }

// Keeps a collective registered with the watchdog until its Work completes; when profiling,
// records it on the profiler's kComm track from issue until completion is seen, and a wait
// that blocks on the kMain track.
class WatchedWork final : public Work {
 public:
  WatchedWork(WorkHandle inner, uint64_t id, std::string op, std::string detail, int64_t began)
      : inner_(std::move(inner)),
        id_(id),
        traced_(profile::enabled()),
        op_(std::move(op)),
        detail_(std::move(detail)),
        began_(began) {}
  ~WatchedWork() override {
    inner_.reset();  // a backend handle dropped without wait() waits here
    end();
  }
  void wait() override {
    const int64_t t0 = traced_ ? profile::now_us() : 0;
    inner_->wait();
    if (traced_)
      profile::complete("wait " + op_, "comm", t0, profile::now_us(), profile::kMain, detail_);
    end();
  }
  bool is_completed() override {
    const bool done = inner_->is_completed();
    if (done) end();
    return done;
  }

 private:
  void end() {
    if (id_) watch_end(id_);
    id_ = 0;
    if (traced_) profile::complete(op_, "comm", began_, profile::now_us(), profile::kComm, detail_);
    traced_ = false;
  }
  WorkHandle inner_;
  uint64_t id_;
  bool traced_;
  std::string op_, detail_;
  int64_t began_;
};

}  // namespace

std::string Communicator::watch_name(const std::string& op, const std::string& tag,
                                     const std::string& note) const {
  const CallSite s{op, label_ + " (" + backend_name() + ")", tag};
  std::string what = s.op + " on " + s.group;
  if (s.group.find("ranks [") == std::string::npos) {
    what += " ranks [";
    for (size_t i = 0; i < ranks_.size(); ++i) what += (i ? ", " : "") + std::to_string(ranks_[i]);
    what += "]";
  }
  if (!s.tag.empty()) what += ", tag '" + s.tag + "'";
  return what + note;
}

uint64_t Communicator::watch(const CallSite& s) const {
  return watch_begin(watch_name(s.op, s.tag));
}

WorkHandle Communicator::watched(WorkHandle inner, const std::string& op, const std::string& tag,
                                 const std::string& note) const {
  const CallSite s = site(op.c_str(), CollectiveOptions{tag, true});
  return std::make_shared<WatchedWork>(std::move(inner), watch_begin(watch_name(op, tag, note)), op,
                                       s.tag.empty() ? s.group : s.tag + " on " + s.group,
                                       profile::now_us());
}

WorkHandle Communicator::finish(WorkHandle work, WatchScope& watched, const CollectiveOptions& opts,
                                const CallSite& s, int64_t began) {
  if (!opts.async_op) {
    // Blocking backends have completed by now; non-blocking ones complete in wait(). The
    // scope ends the registration, also when wait() throws.
    work->wait();
    if (profile::enabled())
      profile::complete(s.op, "comm", began, profile::now_us(), profile::kMain,
                        s.tag.empty() ? s.group : s.tag + " on " + s.group);
    return work;
  }
  return std::make_shared<WatchedWork>(std::move(work), watched.release(), s.op,
                                       s.tag.empty() ? s.group : s.tag + " on " + s.group, began);
}

void Communicator::check_reduce_dtype(const CallSite& s, const at::Tensor& t, ReduceOp op) const {
  if (op == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type()))
    fail_contract(s, "avg needs a floating dtype, got " + describe_tensor(t));
}

WorkHandle Communicator::all_gather_into_tensor(at::Tensor out, const at::Tensor& in,
                                                const CollectiveOptions& opts) {
  const CallSite s = site("all_gather_into_tensor", opts);
  check_buffer(s, "input", in, std::nullopt, device_type());
  check_buffer(s, "output", out, in.scalar_type(), device_type());
  check_numel_ratio(s, "output", out, "input", in, size());
  record_traffic(s.op, static_cast<double>(size() - 1) * bytes_of(in));
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_all_gather(out, in, opts.async_op), watched, opts, s, began);
}

WorkHandle Communicator::reduce_scatter_tensor(at::Tensor out, const at::Tensor& in, ReduceOp op,
                                               const CollectiveOptions& opts) {
  const CallSite s = site("reduce_scatter_tensor", opts);
  check_buffer(s, "input", in, std::nullopt, device_type());
  check_buffer(s, "output", out, in.scalar_type(), device_type());
  check_numel_ratio(s, "input", in, "output", out, size());
  check_reduce_dtype(s, in, op);
  record_traffic(s.op, static_cast<double>(size() - 1) * bytes_of(out));
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_reduce_scatter(out, in, op, opts.async_op), watched, opts, s, began);
}

WorkHandle Communicator::all_reduce(at::Tensor t, ReduceOp op, const CollectiveOptions& opts) {
  const CallSite s = site("all_reduce", opts);
  check_buffer(s, "tensor", t, std::nullopt, device_type());
  check_reduce_dtype(s, t, op);
  record_traffic(s.op,
                 2.0 * static_cast<double>(size() - 1) / static_cast<double>(size()) * bytes_of(t));
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_all_reduce(t, op, opts.async_op), watched, opts, s, began);
}

WorkHandle Communicator::all_reduce_into(at::Tensor out, const at::Tensor& in, ReduceOp op,
                                         const CollectiveOptions& opts) {
  const CallSite s = site("all_reduce", opts);
  check_buffer(s, "input", in, std::nullopt, device_type());
  check_buffer(s, "output", out, in.scalar_type(), device_type());
  check_reduce_dtype(s, in, op);
  if (out.sizes() != in.sizes())
    fail_contract(s, "output " + describe_tensor(out) + " must have the input's shape (input " +
                         describe_tensor(in) + ")");
  const bool in_place = out.data_ptr() == in.data_ptr();
  const auto* o = static_cast<const char*>(out.data_ptr());
  const auto* i = static_cast<const char*>(in.data_ptr());
  const auto bytes = static_cast<size_t>(in.nbytes());
  if (!in_place && bytes > 0 && o < i + bytes && i < o + bytes)
    fail_contract(s, "output " + describe_tensor(out) +
                         " overlaps the input without being it: pass the same tensor for an "
                         "in-place all-reduce, or disjoint ones");
  record_traffic(
      s.op, 2.0 * static_cast<double>(size() - 1) / static_cast<double>(size()) * bytes_of(in));
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(in_place ? do_all_reduce(out, op, opts.async_op)
                         : do_all_reduce_into(out, in, op, opts.async_op),
                watched, opts, s, began);
}

WorkHandle Communicator::do_all_reduce_into(at::Tensor out, at::Tensor in, ReduceOp op,
                                            bool async_op) {
  out.copy_(in);
  return do_all_reduce(out, op, async_op);
}

namespace {
// Expands split sizes (empty: equal split of dim 0) into rows per group rank.
std::vector<int64_t> rows_per_rank(const CallSite& s, const char* role, const at::Tensor& t,
                                   std::vector<int64_t> splits, int64_t size) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  if (splits.empty()) {
    if (rows % size != 0) {
      std::ostringstream os;
      os << role << " has " << rows << " rows, not divisible by group size " << size
         << " and no split sizes were given (" << describe_tensor(t) << ")";
      fail_contract(s, os.str());
    }
    return std::vector<int64_t>(size, rows / size);
  }
  int64_t total = 0;
  for (int64_t v : splits) {
    if (v < 0) fail_contract(s, std::string(role) + " split sizes contain a negative value");
    total += v;
  }
  if (static_cast<int64_t>(splits.size()) != size || total != rows) {
    std::ostringstream os;
    os << role << " split sizes " << c10::IntArrayRef(splits) << " must have one entry per rank ("
       << size << ") summing to dim 0 = " << rows << " (" << describe_tensor(t) << ")";
    fail_contract(s, os.str());
  }
  return splits;
}
}  // namespace

WorkHandle Communicator::all_to_all_single(at::Tensor out, const at::Tensor& in,
                                           std::vector<int64_t> out_splits,
                                           std::vector<int64_t> in_splits,
                                           const CollectiveOptions& opts) {
  const CallSite s = site("all_to_all_single", opts);
  check_buffer(s, "input", in, std::nullopt, device_type());
  check_buffer(s, "output", out, in.scalar_type(), device_type());
  if (in.dim() > 0 && out.dim() > 0 && in.sizes().slice(1) != out.sizes().slice(1))
    fail_contract(s, "input and output differ beyond dim 0: input " + describe_tensor(in) +
                         ", output " + describe_tensor(out));
  auto in_rows = rows_per_rank(s, "input", in, std::move(in_splits), size());
  auto out_rows = rows_per_rank(s, "output", out, std::move(out_splits), size());
  if (traffic_recording()) {
    const int64_t rows = in.dim() == 0 ? 1 : in.size(0);
    const double row_bytes = rows == 0 ? 0.0 : bytes_of(in) / static_cast<double>(rows);
    int64_t away = 0;
    for (int64_t r = 0; r < size(); ++r)
      if (r != rank()) away += in_rows[r];
    record_traffic(s.op, static_cast<double>(away) * row_bytes);
  }
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_all_to_all(out, in, out_rows, in_rows, opts.async_op), watched, opts, s, began);
}

WorkHandle Communicator::broadcast(at::Tensor t, int64_t root, const CollectiveOptions& opts) {
  const CallSite s = site("broadcast", opts);
  check_buffer(s, "tensor", t, std::nullopt, device_type());
  if (root < 0 || root >= size())
    fail_contract(s, "root " + std::to_string(root) + " is not a group rank in [0, " +
                         std::to_string(size()) + ")");
  record_traffic(s.op, root == rank() && size() > 1 ? bytes_of(t) : 0.0);
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_broadcast(t, root, opts.async_op), watched, opts, s, began);
}

WorkHandle Communicator::barrier(const CollectiveOptions& opts) {
  const CallSite s = site("barrier", opts);
  record_traffic(s.op, 0.0);
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_barrier(opts.async_op), watched, opts, s, began);
}

void Communicator::check_peer(const CallSite& s, int64_t peer, int64_t tag) const {
  if (peer < 0 || peer >= size())
    fail_contract(s, "peer " + std::to_string(peer) + " is not a group rank (the group has " +
                         std::to_string(size()) + " ranks)");
  if (peer == rank()) fail_contract(s, "peer " + std::to_string(peer) + " is this rank itself");
  if (tag < 0 || tag >= (int64_t{1} << 24))
    fail_contract(s, "message_tag " + std::to_string(tag) + " is outside [0, 2^24)");
}

WorkHandle Communicator::send(const at::Tensor& t, int64_t peer, const CollectiveOptions& opts) {
  const CallSite s = site("send", opts);
  check_buffer(s, "tensor", t, std::nullopt, device_type());
  check_peer(s, peer, opts.message_tag);
  record_traffic(s.op, bytes_of(t));
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  return finish(do_send(t, peer, opts.message_tag), watched, opts, s, began);
}

WorkHandle Communicator::recv(at::Tensor t, int64_t peer, const CollectiveOptions& opts) {
  const CallSite s = site("recv", opts);
  check_buffer(s, "tensor", t, std::nullopt, device_type());
  check_peer(s, peer, opts.message_tag);
  record_traffic(s.op, 0.0);
  WatchScope watched(watch(s));
  const int64_t began = profile::now_us();
  const std::string what = "recv on " + s.group + " from group rank " + std::to_string(peer) +
                           (s.tag.empty() ? "" : ", tag '" + s.tag + "'") + " into " +
                           describe_tensor(t);
  return finish(do_recv(t, peer, opts.message_tag, what), watched, opts, s, began);
}

std::shared_ptr<HostWindow> Communicator::host_window(size_t) { return nullptr; }

}  // namespace hyperpar::comm
