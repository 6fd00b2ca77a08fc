#include "hyperpar/comm/mpi_communicator.h"

#include <ATen/ATen.h>

#include <climits>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "hyperpar/core/error.h"
#include "shm_arena.h"
#include "shm_collective.h"

namespace hyperpar::comm {
namespace {

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(std::string("MPI call ") + what + " failed: " + std::string(msg, len));
  }
}

MPI_Datatype mpi_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return MPI_FLOAT;
    case c10::kDouble:
      return MPI_DOUBLE;
    case c10::kInt:
      return MPI_INT32_T;
    case c10::kLong:
      return MPI_INT64_T;
    case c10::kShort:
      return MPI_INT16_T;
    case c10::kChar:
      return MPI_INT8_T;
    case c10::kByte:
      return MPI_UINT8_T;
    case c10::kBool:
      return MPI_C_BOOL;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;  // avg: one division at completion
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// Type used to move data: the natural type, or raw bytes for dtypes MPI lacks.
struct MoveType {
  MPI_Datatype type;
  int64_t per_element;  // MPI elements per tensor element
};
MoveType move_type(const at::Tensor& t) {
  MPI_Datatype d = mpi_type(t.scalar_type());
  if (d != MPI_DATATYPE_NULL) return {d, 1};
  return {MPI_BYTE, static_cast<int64_t>(t.element_size())};
}

int as_count(int64_t n, const char* op) {
  HP_CHECK(n <= INT_MAX, op, ": ", n, " elements exceed MPI's int count limit (", INT_MAX,
           "); split the buffer");
  return static_cast<int>(n);
}

MPI_Datatype reduce_type(const at::Tensor& t, const char* op) {
  // MPI defines sum/max/min only for numeric types: a bool reduction would fail inside MPI.
  HP_CHECK(t.scalar_type() != c10::kBool, op,
           ": the MPI backend cannot sum/max/min a Bool tensor; convert it to an integer dtype");
  MPI_Datatype d = mpi_type(t.scalar_type());
  HP_CHECK(d != MPI_DATATYPE_NULL, op, ": the MPI backend cannot reduce dtype ", t.scalar_type(),
           "; reduce in float32 (reduce_dtype) instead");
  return d;
}

class MpiWork final : public FinishingWork {
 public:
  MpiWork(MPI_Request req, std::vector<at::Tensor> keep, std::function<void()> on_done)
      : FinishingWork(std::move(on_done)), req_(req), keep_(std::move(keep)) {}
  ~MpiWork() override { wait_unless_done(); }

 private:
  void backend_wait() override { mpi_check(MPI_Wait(&req_, MPI_STATUS_IGNORE), "MPI_Wait"); }
  bool backend_test() override {
    int flag = 0;
    mpi_check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }
  void on_finished() override { keep_.clear(); }
  MPI_Request req_;
  std::vector<at::Tensor> keep_;
};

// A receive, matched when waited on: the message is probed first (MPI_Mprobe), so one of
// another size is an error naming the recv instead of MPI's fatal MPI_ERR_TRUNCATE, then
// received (MPI_Mrecv). Pipelines wait on a receive right before the compute that needs it.
class MpiRecvWork final : public FinishingWork {
 public:
  MpiRecvWork(MPI_Comm comm, at::Tensor t, int peer, int tag, std::string what)
      : FinishingWork(nullptr),
        comm_(comm),
        t_(std::move(t)),
        peer_(peer),
        tag_(tag),
        what_(std::move(what)) {}
  ~MpiRecvWork() override { wait_unless_done(); }

 private:
  void backend_wait() override {
    if (consumed_) return;  // a size mismatch already reported by is_completed()
    MPI_Message msg;
    MPI_Status st;
    mpi_check(MPI_Mprobe(peer_, tag_, comm_, &msg, &st), "MPI_Mprobe");
    receive(msg, st);
  }
  bool backend_test() override {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    mpi_check(MPI_Improbe(peer_, tag_, comm_, &flag, &msg, &st), "MPI_Improbe");
    if (flag) receive(msg, st);
    return flag != 0;
  }
  void receive(MPI_Message& msg, MPI_Status& st) {
    consumed_ = true;
    int got = -1;
    MPI_Get_count(&st, MPI_BYTE, &got);
    const auto want = static_cast<int64_t>(t_.nbytes());
    if (got != want) {
      // Take the message off the queue (into scratch) so the job can end cleanly.
      std::vector<char> scratch(static_cast<size_t>(std::max(got, 0)));
      MPI_Mrecv(scratch.data(), got, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      throw Error(what_ + ": the message has " + std::to_string(got) + " bytes, the buffer " +
                  std::to_string(want) + " (sender and receiver disagree on the shape or dtype)");
    }
    mpi_check(MPI_Mrecv(t_.data_ptr(), got, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
  }
  void on_finished() override { t_ = at::Tensor(); }
  MPI_Comm comm_;
  at::Tensor t_;
  int peer_, tag_;
  std::string what_;
  bool consumed_ = false;
};

std::function<void()> divide_if_avg(ReduceOp op, at::Tensor t, int64_t n) {
  if (op != ReduceOp::kAvg) return {};
  return [t, n]() mutable { t.div_(static_cast<double>(n)); };
}

// Blocking calls finish before returning; only an average's division remains.
WorkHandle completed(const std::function<void()>& finish = {}) {
  if (finish) finish();
  return std::make_shared<CompletedWork>();
}

// Every rank's string, in group rank order (the rings' set-up exchange).
std::vector<std::string> exchange_strings(MPI_Comm comm, const std::string& mine) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  const int len = as_count(static_cast<int64_t>(mine.size()), "exchange");
  std::vector<int> lens(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  mpi_check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < n; ++r) {
    displs[static_cast<size_t>(r)] = total;
    total += lens[static_cast<size_t>(r)];
  }
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  mpi_check(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                           MPI_CHAR, comm),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(all.data() + displs[static_cast<size_t>(r)],
                     static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

}  // namespace

void ensure_mpi_initialized() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  });
}

MPI_Comm create_mpi_comm(const std::vector<int64_t>& ranks) {
  ensure_mpi_initialized();
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  std::vector<int> r(ranks.begin(), ranks.end());
  std::vector<int> identity(world_size);
  std::iota(identity.begin(), identity.end(), 0);
  if (r == identity) {
    MPI_Comm dup;
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    return dup;
  }
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  mpi_check(MPI_Group_incl(world_group, static_cast<int>(r.size()), r.data(), &group),
            "MPI_Group_incl");
  // The tag only has to agree among members; derive it from the rank set.
  size_t h = 0;
  for (int v : r) h = h * 1000003u + static_cast<size_t>(v);
  MPI_Comm comm;
  mpi_check(MPI_Comm_create_group(MPI_COMM_WORLD, group, static_cast<int>(h % 32000), &comm),
            "MPI_Comm_create_group");
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return comm;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::vector<int64_t> ranks, int64_t global_rank,
                                 std::string label)
    : Communicator(std::move(ranks), global_rank, std::move(label)), comm_(comm) {
  const ShmSettings settings = shm_settings("MPI");
  if (size() < 2 || !settings.enabled) return;
  const MPI_Comm c = comm_;
  std::unique_ptr<ShmRing> ring;
  try {
    ring = std::make_unique<ShmRing>(
        [c](const std::string& mine, int) { return exchange_strings(c, mine); }, size(), rank(),
        settings.ring_bytes);
  } catch (const std::exception& e) {
    throw Error(detail::concat("mpi backend: cannot set up shared memory for ", this->label(), ": ",
                               e.what()));
  }
  if (!ring->enabled()) return;  // the same outcome on every rank (exchanged by the ring)
  mpi_check(MPI_Comm_dup(comm_, &fallback_comm_), "MPI_Comm_dup");
  const MPI_Comm fb = fallback_comm_;
  ShmCollectives::Fallback fallback{
      [fb](const at::Tensor& bytes, int64_t peer, int tag) -> WorkHandle {
        MPI_Request req;
        mpi_check(MPI_Isend(bytes.data_ptr(), as_count(bytes.numel(), "send"), MPI_BYTE,
                            static_cast<int>(peer), tag, fb, &req),
                  "MPI_Isend");
        return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{bytes}, nullptr);
      },
      [fb](const at::Tensor& bytes, int64_t peer, int tag) {
        mpi_check(MPI_Recv(bytes.data_ptr(), as_count(bytes.numel(), "recv"), MPI_BYTE,
                           static_cast<int>(peer), tag, fb, MPI_STATUS_IGNORE),
                  "MPI_Recv");
      }};
  shm_ = std::make_unique<ShmCollectives>(std::move(ring), size(), rank(), std::move(fallback));
  ShmArena::install_for_process();  // so reduce-scatters lend gradients instead of copying
}

MpiCommunicator::~MpiCommunicator() {
  shm_.reset();
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  if (fallback_comm_ != MPI_COMM_NULL) MPI_Comm_free(&fallback_comm_);
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::shared_ptr<HostWindow> MpiCommunicator::host_window(size_t bytes) {
  if (!shm_) return nullptr;  // the same on every rank: the rings' set-up was exchanged
  const MPI_Comm c = comm_;
  auto w = std::make_shared<HostWindow>(
      [c](const std::string& mine, int) { return exchange_strings(c, mine); }, size(), rank(),
      bytes);
  return w->enabled() ? w : nullptr;
}

WorkHandle MpiCommunicator::shm_work(ShmKind kind, at::Tensor out, at::Tensor in, bool average) {
  // Fallback messages are tagged by the operation's number; MPI guarantees tags up to 32767,
  // and far fewer operations are ever in flight (the ring has 1024 note slots).
  const uint64_t call = shm_calls_++;
  return shm_->start(kind, std::move(out), std::move(in), call, static_cast<int>(call % 32768),
                     average);
}

WorkHandle MpiCommunicator::do_all_gather(at::Tensor out, at::Tensor in, bool async_op) {
  if (shm_ && in.numel() > 0)
    return shm_work(ShmKind::kAllGather, bytes_of(out), bytes_of(in), false);
  MoveType mt = move_type(in);
  int n = as_count(in.numel() * mt.per_element, "all_gather_into_tensor");
  if (!async_op) {
    mpi_check(MPI_Allgather(in.data_ptr(), n, mt.type, out.data_ptr(), n, mt.type, comm_),
              "MPI_Allgather");
    return completed();
  }
  MPI_Request req;
  mpi_check(MPI_Iallgather(in.data_ptr(), n, mt.type, out.data_ptr(), n, mt.type, comm_, &req),
            "MPI_Iallgather");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{out, in}, nullptr);
}

WorkHandle MpiCommunicator::do_reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op,
                                              bool async_op) {
  MPI_Datatype d = reduce_type(in, "reduce_scatter_tensor");
  if (shm_ && (op == ReduceOp::kSum || op == ReduceOp::kAvg) && out.numel() > 0)
    return shm_work(ShmKind::kReduceScatter, out.view({-1}), in.view({-1}), op == ReduceOp::kAvg);
  int n = as_count(out.numel(), "reduce_scatter_tensor");
  if (!async_op) {
    mpi_check(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), n, d, mpi_op(op), comm_),
              "MPI_Reduce_scatter_block");
    return completed(divide_if_avg(op, out, size()));
  }
  MPI_Request req;
  mpi_check(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), n, d, mpi_op(op), comm_, &req),
            "MPI_Ireduce_scatter_block");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{out, in},
                                   divide_if_avg(op, out, size()));
}

WorkHandle MpiCommunicator::do_all_reduce(at::Tensor t, ReduceOp op, bool async_op) {
  MPI_Datatype d = reduce_type(t, "all_reduce");
  if (shm_ && (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
      shm_->takes_all_reduce(t.numel() * t.element_size()))
    return shm_work(ShmKind::kAllReduce, t.view({-1}), t.view({-1}), op == ReduceOp::kAvg);
  int n = as_count(t.numel(), "all_reduce");
  if (!async_op) {
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), n, d, mpi_op(op), comm_), "MPI_Allreduce");
    return completed(divide_if_avg(op, t, size()));
  }
  MPI_Request req;
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), n, d, mpi_op(op), comm_, &req),
            "MPI_Iallreduce");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{t}, divide_if_avg(op, t, size()));
}

WorkHandle MpiCommunicator::do_all_reduce_into(at::Tensor out, at::Tensor in, ReduceOp op,
                                               bool async_op) {
  MPI_Datatype d = reduce_type(in, "all_reduce");
  if (shm_ && (op == ReduceOp::kSum || op == ReduceOp::kAvg) &&
      shm_->takes_all_reduce(in.numel() * in.element_size()))
    return shm_work(ShmKind::kAllReduce, out.view({-1}), in.view({-1}), op == ReduceOp::kAvg);
  int n = as_count(in.numel(), "all_reduce");
  if (!async_op) {
    mpi_check(MPI_Allreduce(in.data_ptr(), out.data_ptr(), n, d, mpi_op(op), comm_),
              "MPI_Allreduce");
    return completed(divide_if_avg(op, out, size()));
  }
  MPI_Request req;
  mpi_check(MPI_Iallreduce(in.data_ptr(), out.data_ptr(), n, d, mpi_op(op), comm_, &req),
            "MPI_Iallreduce");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{out, in},
                                   divide_if_avg(op, out, size()));
}

WorkHandle MpiCommunicator::do_all_to_all(at::Tensor out, at::Tensor in,
                                          const std::vector<int64_t>& out_rows,
                                          const std::vector<int64_t>& in_rows, bool) {
  MoveType mt = move_type(in);
  const int64_t in_row_elems = in.dim() == 0 || in.size(0) == 0 ? 0 : in.numel() / in.size(0);
  const int64_t out_row_elems = out.dim() == 0 || out.size(0) == 0 ? 0 : out.numel() / out.size(0);
  const int64_t row = std::max(in_row_elems, out_row_elems) * mt.per_element;
  std::vector<int> sc(size()), sd(size()), rc(size()), rd(size());
  int64_t so = 0, ro = 0;
  for (int64_t i = 0; i < size(); ++i) {
    sc[i] = as_count(in_rows[i] * row, "all_to_all_single");
    rc[i] = as_count(out_rows[i] * row, "all_to_all_single");
    sd[i] = as_count(so, "all_to_all_single");
    rd[i] = as_count(ro, "all_to_all_single");
    so += sc[i];
    ro += rc[i];
  }
  MPI_Request req;
  mpi_check(MPI_Ialltoallv(in.data_ptr(), sc.data(), sd.data(), mt.type, out.data_ptr(), rc.data(),
                           rd.data(), mt.type, comm_, &req),
            "MPI_Ialltoallv");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{out, in}, nullptr);
}

WorkHandle MpiCommunicator::do_broadcast(at::Tensor t, int64_t root, bool) {
  MoveType mt = move_type(t);
  MPI_Request req;
  mpi_check(MPI_Ibcast(t.data_ptr(), as_count(t.numel() * mt.per_element, "broadcast"), mt.type,
                       static_cast<int>(root), comm_, &req),
            "MPI_Ibcast");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{t}, nullptr);
}

WorkHandle MpiCommunicator::do_barrier(bool) {
  MPI_Request req;
  mpi_check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{}, nullptr);
}

WorkHandle MpiCommunicator::do_send(at::Tensor t, int64_t peer, int64_t tag) {
  MPI_Request req;
  mpi_check(MPI_Isend(t.data_ptr(), as_count(static_cast<int64_t>(t.nbytes()), "send"), MPI_BYTE,
                      static_cast<int>(peer), static_cast<int>(tag), comm_, &req),
            "MPI_Isend");
  return std::make_shared<MpiWork>(req, std::vector<at::Tensor>{t}, nullptr);
}

WorkHandle MpiCommunicator::do_recv(at::Tensor t, int64_t peer, int64_t tag,
                                    const std::string& what) {
  as_count(static_cast<int64_t>(t.nbytes()), "recv");
  return std::make_shared<MpiRecvWork>(comm_, t, static_cast<int>(peer), static_cast<int>(tag),
                                       what);
}

}  // namespace hyperpar::comm
