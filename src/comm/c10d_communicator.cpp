#include "hyperpar/comm/c10d_communicator.h"

#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/error.h"
#include "shm_arena.h"
#include "shm_collective.h"

#ifdef HYPERPAR_HAVE_GLOO
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace hyperpar::comm {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// Rendezvous (the store, a new group's connections) waits at most the collective timeout in
// force when it starts: comm.init_timeout_s during start-up (watchdog.h).
std::chrono::milliseconds rendezvous_timeout() {
  return std::chrono::milliseconds(static_cast<int64_t>(collective_timeout_s() * 1000));
}

// gloo's own collective timeout: longer than the watchdog's, so that the watchdog, which
// names the op, group and tag, fires first.
std::chrono::milliseconds gloo_collective_timeout() {
  return rendezvous_timeout() + std::chrono::seconds(60);
}

// The store every group's rendezvous goes through, created on first use.
c10::intrusive_ptr<c10d::Store> process_store() {
  static c10::intrusive_ptr<c10d::Store> store = [] {
    const std::string addr = env_or("MASTER_ADDR", "127.0.0.1");
    const std::string port = env_or("MASTER_PORT", "29500");
    const int64_t rank = std::stoll(env_or("RANK", "0"));
    const int64_t size = std::stoll(env_or("WORLD_SIZE", "1"));
    const bool agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(std::stoi(port));
    opts.isServer = !agent_store && rank == 0;
    opts.numWorkers = agent_store ? std::nullopt : std::optional<std::size_t>(size);
    opts.waitWorkers = false;
    opts.timeout = rendezvous_timeout();
    c10::intrusive_ptr<c10d::Store> tcp;
    try {
      tcp = c10::make_intrusive<c10d::TCPStore>(addr, opts);
    } catch (const std::exception& e) {
      throw Error(detail::concat("gloo backend: cannot ", opts.isServer ? "serve" : "reach",
                                 " the rendezvous store (master) at ", addr, ":", port, " (rank ",
                                 rank, " of ", size, "); gave up after ", collective_timeout_s(),
                                 " s (comm.init_timeout_s): ", e.what()));
    }
    // torchrun's agent store is shared by restarts: keep each attempt's keys apart.
    const std::string prefix =
        agent_store ? "hyperpar/attempt_" + env_or("TORCHELASTIC_RESTART_COUNT", "0") : "hyperpar";
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::PrefixStore>(prefix, tcp));
  }();
  return store;
}

std::shared_ptr<::gloo::transport::Device> gloo_device() {
  static std::shared_ptr<::gloo::transport::Device> device = [] {
    const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
    if (!ifname.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    const std::string addr = env_or("MASTER_ADDR", "127.0.0.1");
    if (addr == "localhost" || addr.rfind("127.", 0) == 0)
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }();
  return device;
}

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // sum, then one division at completion
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void check_reducible(const at::Tensor& t, const char* op) {
  const auto s = t.scalar_type();
  const bool ok = s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16 ||
                  s == at::kInt || s == at::kLong || s == at::kChar || s == at::kByte;
  HP_CHECK(ok, op, ": the gloo backend cannot reduce dtype ", s,
           "; use float32/64, float16, bfloat16 or an integer dtype");
}

// Raw bytes of a contiguous tensor, as a 1-D uint8 view (for dtype-agnostic data movement).
at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

class C10dWork final : public FinishingWork {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> on_done)
      : FinishingWork(std::move(on_done)), work_(std::move(work)) {}
  ~C10dWork() override { wait_unless_done(); }

 private:
  void backend_wait() override {
    try {
      work_->wait();
    } catch (const std::exception& e) {
      // After a successful rendezvous, a failing gloo collective means a peer went away.
      throw PeerError(std::string("gloo collective failed (a peer exited or closed its "
                                  "connection): ") +
                      e.what());
    }
  }
  bool backend_test() override {
    if (!work_->isCompleted()) return false;
    backend_wait();  // returns at once, or throws the collective's error
    return true;
  }
  c10::intrusive_ptr<c10d::Work> work_;
};

// Several gloo works that finish together (an all-gather's sends and receives).
class C10dWorks final : public FinishingWork {
 public:
  explicit C10dWorks(std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : FinishingWork(nullptr), works_(std::move(works)) {}
  ~C10dWorks() override { wait_unless_done(); }

 private:
  void backend_wait() override {
    for (auto& w : works_) C10dWork(w, nullptr).wait();
  }
  bool backend_test() override {
    for (auto& w : works_)
      if (!w->isCompleted()) return false;
    backend_wait();  // returns at once, or throws the first error
    return true;
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// gloo ends the process from its I/O thread when a message's size differs from the
// receiving buffer's, so every point-to-point message is preceded by its byte count
// (8 bytes, tag 2t): the receive checks it and raises an error naming itself before it
// posts the payload's receive (tag 2t + 1).
class GlooRecvWork final : public FinishingWork {
 public:
  GlooRecvWork(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, at::Tensor t, int peer, int tag,
               std::string what)
      : FinishingWork(nullptr),
        pg_(std::move(pg)),
        t_(std::move(t)),
        peer_(peer),
        tag_(tag),
        what_(std::move(what)),
        header_(at::empty({1}, at::kLong)) {
    std::vector<at::Tensor> h{header_};
    header_work_ = pg_->recv(h, peer_, 2 * tag_);
  }
  ~GlooRecvWork() override { wait_unless_done(); }

 private:
  void backend_wait() override {
    C10dWork(header_work_, nullptr).wait();
    const int64_t got = header_.item<int64_t>(), want = static_cast<int64_t>(t_.nbytes());
    if (got != want) {
      // Take the payload anyway (into scratch): gloo's send completes only once a receive
      // is posted for it, so the sender is not left waiting.
      std::vector<at::Tensor> scratch{at::empty({std::max<int64_t>(got, 0)}, at::kByte)};
      C10dWork(pg_->recv(scratch, peer_, 2 * tag_ + 1), nullptr).wait();
      throw Error(what_ + ": the message has " + std::to_string(got) + " bytes, the buffer " +
                  std::to_string(want) + " (sender and receiver disagree on the shape or dtype)");
    }
    std::vector<at::Tensor> ts{bytes_of(t_)};
    C10dWork(pg_->recv(ts, peer_, 2 * tag_ + 1), nullptr).wait();
  }
  bool backend_test() override {
    if (!header_work_->isCompleted()) return false;
    backend_wait();
    return true;
  }
  void on_finished() override { t_ = at::Tensor(); }
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  at::Tensor t_;
  int peer_, tag_;
  std::string what_;
  at::Tensor header_;
  c10::intrusive_ptr<c10d::Work> header_work_;
};

// A send: its byte count, then the payload (see GlooRecvWork).
class GlooSendWork final : public FinishingWork {
 public:
  GlooSendWork(const c10::intrusive_ptr<c10d::ProcessGroupGloo>& pg, const at::Tensor& t, int peer,
               int tag)
      : FinishingWork(nullptr),
        header_(at::full({1}, static_cast<int64_t>(t.nbytes()), at::kLong)),
        payload_(bytes_of(t)) {
    std::vector<at::Tensor> h{header_}, p{payload_};
    header_work_ = pg->send(h, peer, 2 * tag);
    payload_work_ = pg->send(p, peer, 2 * tag + 1);
  }
  ~GlooSendWork() override { wait_unless_done(); }

 private:
  void backend_wait() override {
    C10dWork(header_work_, nullptr).wait();
    C10dWork(payload_work_, nullptr).wait();
  }
  bool backend_test() override {
    if (!header_work_->isCompleted() || !payload_work_->isCompleted()) return false;
    backend_wait();
    return true;
  }
  at::Tensor header_, payload_;
  c10::intrusive_ptr<c10d::Work> header_work_, payload_work_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const std::vector<int64_t>& ranks, int64_t global_rank, std::string label)
      : Communicator(ranks, global_rank, std::move(label)) {
    std::ostringstream key;
    key << "group";
    for (int64_t r : ranks) key << "_" << r;
    auto opts = c10d::ProcessGroupGloo::Options::create(gloo_collective_timeout());
    opts->devices.push_back(gloo_device());
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(key.str(), process_store()),
          static_cast<int>(rank()), static_cast<int>(size()), opts);
    } catch (const std::exception& e) {
      throw Error(detail::concat("gloo backend: cannot create the communicator of ", this->label(),
                                 ": ", e.what()));
    }
    const ShmSettings shm = shm_settings("GLOO");
    if (size() > 1 && shm.enabled) {
      store_key_ = key.str();
      const int64_t me = rank(), n = size();
      const auto exchange = store_exchange("/shm");
      std::unique_ptr<ShmRing> ring;
      try {
        ring = std::make_unique<ShmRing>(exchange, n, me, shm.ring_bytes);
      } catch (const std::exception& e) {
        throw Error(detail::concat("gloo backend: cannot set up shared memory for ", this->label(),
                                   ": ", e.what()));
      }
      auto pg = pg_;
      ShmCollectives::Fallback fallback{
          [pg](const at::Tensor& bytes, int64_t peer, int tag) -> WorkHandle {
            std::vector<at::Tensor> t{bytes};
            return std::make_shared<C10dWork>(pg->send(t, static_cast<int>(peer), tag), nullptr);
          },
          [pg](const at::Tensor& bytes, int64_t peer, int tag) {
            std::vector<at::Tensor> t{bytes};
            C10dWork(pg->recv(t, static_cast<int>(peer), tag), nullptr).wait();
          }};
      shm_ = std::make_unique<ShmCollectives>(std::move(ring), n, me, std::move(fallback));
      if (shm_->enabled()) ShmArena::install_for_process();  // reduce-scatters lend gradients
    }
  }
  const char* backend_name() const override { return "gloo"; }
  // Where the group's shared-memory rings are on (one host, HYPERPAR_GLOO_SHM not 0); each
  // window exchanges its identities under its own store prefix.
  std::shared_ptr<HostWindow> host_window(size_t bytes) override {
    if (!shm_enabled()) return nullptr;  // the same on every rank (exchanged by the rings)
    auto w = std::make_shared<HostWindow>(store_exchange("/window" + std::to_string(windows_++)),
                                          size(), rank(), bytes);
    return w->enabled() ? w : nullptr;
  }

 protected:
  // All-gather: this rank's chunk is sent as it is to every peer, and each peer's chunk is
  // received straight into its slice of `out`, all pairs at once. gloo's ring would pass the
  // data through n - 1 sequential steps over TCP (62 ms against 38 ms for 16 MiB on 8 ranks
  // of one host), and its all-to-all needs the chunk repeated n times in a send buffer first:
  // a pass over the whole gathered size per call (1-3% of an FSDP8 step's CPU time, 3 pairs).
  WorkHandle do_all_gather(at::Tensor out, at::Tensor in, bool) override {
    const at::Tensor i = bytes_of(in), o = bytes_of(out);
    const int64_t n = size(), me = rank(), chunk = i.numel();
    if (shm_enabled() && chunk > 0) return shm_work(ShmCollectives::Kind::kAllGather, o, i, false);
    const int tag = call_tag(next_call());
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int64_t k = 1; k < n && chunk > 0; ++k) {  // nothing to send for empty chunks
      const int64_t to = (me + k) % n, from = (me + n - k) % n;
      std::vector<at::Tensor> send{i}, recv{o.narrow(0, from * chunk, chunk)};
      works.push_back(pg_->send(send, static_cast<int>(to), tag));
      works.push_back(pg_->recv(recv, static_cast<int>(from), tag));
    }
    o.narrow(0, me * chunk, chunk).copy_(i);
    return std::make_shared<C10dWorks>(std::move(works));
  }
  // Sum/avg reduce-scatter goes through gloo's all-to-all, which exchanges every pair at
  // once, instead of gloo's ring (85-115 -> 38-43 ms for 16 MiB on 8 ranks of one host); the
  // n received chunks are summed in rank order at completion (deterministic on every rank).
  WorkHandle do_reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op, bool) override {
    check_reducible(in, "reduce_scatter_tensor");
    at::Tensor flat_out = out.view({-1}), flat_in = in.view({-1});
    if (op != ReduceOp::kSum && op != ReduceOp::kAvg) {
      c10d::ReduceScatterOptions o;
      o.reduceOp = c10d_op(op);
      return wrap(pg_->_reduce_scatter_base(flat_out, flat_in, o), {});
    }
    if (shm_enabled() && flat_out.numel() > 0)
      return shm_work(ShmCollectives::Kind::kReduceScatter, flat_out, flat_in,
                      op == ReduceOp::kAvg);
    at::Tensor chunks = at::empty_like(flat_in);
    at::Tensor c = bytes_of(chunks), i = bytes_of(flat_in);
    auto divide = divide_if_avg(op, out);
    const int64_t n = size();
    std::vector<int64_t> equal;
    return wrap(pg_->alltoall_base(c, i, equal, equal), [chunks, flat_out, n, divide]() mutable {
      at::sum_out(flat_out, chunks.view({n, -1}), {0}, false, flat_out.scalar_type());
      if (divide) divide();
    });
  }
  WorkHandle do_all_reduce(at::Tensor t, ReduceOp op, bool) override {
    check_reducible(t, "all_reduce");
    if (shm_ && (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
        shm_->takes_all_reduce(t.numel() * t.element_size()))
      return shm_work(ShmCollectives::Kind::kAllReduce, t.view({-1}), t.view({-1}),
                      op == ReduceOp::kAvg);
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(op);
    std::vector<at::Tensor> ts{t.view({-1})};
    return wrap(pg_->allreduce(ts, o), divide_if_avg(op, t));
  }
  WorkHandle do_all_reduce_into(at::Tensor out, at::Tensor in, ReduceOp op,
                                bool async_op) override {
    check_reducible(in, "all_reduce");
    if (shm_ && (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
        shm_->takes_all_reduce(in.numel() * in.element_size()))
      return shm_work(ShmCollectives::Kind::kAllReduce, out.view({-1}), in.view({-1}),
                      op == ReduceOp::kAvg);
    return Communicator::do_all_reduce_into(out, in, op, async_op);  // gloo: in place only
  }
  WorkHandle do_all_to_all(at::Tensor out, at::Tensor in, const std::vector<int64_t>& out_rows,
                           const std::vector<int64_t>& in_rows, bool) override {
    // Rows of the two sides hold the same number of elements (checked by Communicator).
    const int64_t in_row = in.dim() == 0 || in.size(0) == 0 ? 0 : in.nbytes() / in.size(0);
    const int64_t out_row = out.dim() == 0 || out.size(0) == 0 ? 0 : out.nbytes() / out.size(0);
    const int64_t row = std::max(in_row, out_row);
    std::vector<int64_t> os, is;
    for (int64_t v : out_rows) os.push_back(v * row);
    for (int64_t v : in_rows) is.push_back(v * row);
    at::Tensor o = bytes_of(out), i = bytes_of(in);
    return wrap(pg_->alltoall_base(o, i, os, is), {});
  }
  WorkHandle do_broadcast(at::Tensor t, int64_t root, bool) override {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    std::vector<at::Tensor> ts{bytes_of(t)};
    return wrap(pg_->broadcast(ts, o), {});
  }
  WorkHandle do_barrier(bool) override { return wrap(pg_->barrier(), {}); }
  WorkHandle do_send(at::Tensor t, int64_t peer, int64_t tag) override {
    return std::make_shared<GlooSendWork>(pg_, t, static_cast<int>(peer), static_cast<int>(tag));
  }
  WorkHandle do_recv(at::Tensor t, int64_t peer, int64_t tag, const std::string& what) override {
    return std::make_shared<GlooRecvWork>(pg_, t, static_cast<int>(peer), static_cast<int>(tag),
                                          what);
  }

 private:
  std::function<void()> divide_if_avg(ReduceOp op, at::Tensor t) const {
    if (op != ReduceOp::kAvg) return {};
    const double n = static_cast<double>(size());
    return [t, n]() mutable { t.div_(n); };
  }
  static WorkHandle wrap(c10::intrusive_ptr<c10d::Work> w, std::function<void()> on_done) {
    return std::make_shared<C10dWork>(std::move(w), std::move(on_done));
  }
  // Collectives made of point-to-point messages or going through the shared-memory rings
  // number their calls: every rank of the group makes the same calls in the same order, so
  // the numbers agree. A call's number is its ring operation and gives its message tag,
  // above the users' (a message tag t < 2^24 travels as 2t and 2t + 1, see GlooRecvWork).
  uint64_t next_call() { return collective_calls_++; }
  static int call_tag(uint64_t call) {
    constexpr uint64_t kFirst = 1 << 25, kCount = 1 << 30;
    return static_cast<int>(kFirst + call % kCount);
  }
  // Shared-memory rings of this group's ranks (shm_collective.h): all-gathers, sum
  // reduce-scatters and sum all-reduces whose ranks share a host move their data by one copy
  // between processes, not through TCP. HYPERPAR_GLOO_SHM=0 turns them off;
  // HYPERPAR_GLOO_SHM_BYTES sets each rank's ring (an operation that finds no room goes over
  // TCP).
  std::unique_ptr<ShmCollectives> shm_;
  bool shm_enabled() const { return shm_ && shm_->enabled(); }
  WorkHandle shm_work(ShmCollectives::Kind kind, at::Tensor out, at::Tensor in, bool average) {
    const uint64_t call = next_call();
    return shm_->start(kind, std::move(out), std::move(in), call, call_tag(call), average);
  }
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  uint64_t collective_calls_ = 0;
  std::string store_key_;  // the group's prefix in the rendezvous store
  uint64_t windows_ = 0;   // host windows created (same on every rank)
  // A blocking all-gather of strings through the store, under the group's key + `suffix`.
  std::function<std::vector<std::string>(const std::string&, int)> store_exchange(
      const std::string& suffix) const {
    auto store = c10::make_intrusive<c10d::PrefixStore>(store_key_ + suffix, process_store());
    const int64_t me = rank(), n = size();
    return [store, me, n](const std::string& mine, int round) {
      const std::string base = "round" + std::to_string(round) + "/";
      store->set(base + std::to_string(me), std::vector<uint8_t>(mine.begin(), mine.end()));
      std::vector<std::string> all;
      for (int64_t r = 0; r < n; ++r) {
        const auto v = store->get(base + std::to_string(r));
        all.emplace_back(v.begin(), v.end());
      }
      return all;
    };
  }
};

}  // namespace

bool gloo_available() { return true; }

void connect_gloo_store() { process_store(); }

std::shared_ptr<Communicator> make_gloo_communicator(const std::vector<int64_t>& ranks,
                                                     int64_t global_rank,
                                                     const std::string& label) {
  return std::make_shared<GlooCommunicator>(ranks, global_rank, label);
}

}  // namespace hyperpar::comm

#else  // built without gloo headers

namespace hyperpar::comm {
bool gloo_available() { return false; }
void connect_gloo_store() {}
std::shared_ptr<Communicator> make_gloo_communicator(const std::vector<int64_t>&, int64_t,
                                                     const std::string& label) {
  throw Error(
      "this hyperpar build has no gloo backend (gloo headers were not found at "
      "configure time; install libgloo-dev and reconfigure); cannot create " +
      label);
}
}  // namespace hyperpar::comm
#endif
