#pragma once
// MpiCommunicator: collectives on an MPI communicator holding exactly one rank set.
// When the group's ranks share a host, all-gathers, sum/avg reduce-scatters and sum/avg
// all-reduces of TP-sized groups or small tensors go through shared-memory rings
// (src/comm/shm_collective.h, as the gloo backend): issuing one publishes this rank's data at
// once, so an async collective progresses while the rank computes, where Open MPI's
// non-blocking collectives (libnbc) move only inside MPI calls; waits sleep on futexes instead
// of Open MPI's yield loop. HYPERPAR_MPI_SHM=0 turns this off, HYPERPAR_MPI_SHM_BYTES sets
// each rank's ring (default 64 MiB; an operation that finds no room goes over MPI_Isend/Recv).
// The rest: async_op calls are MPI-3 non-blocking collectives (MPI_Iallgather, ...) whose
// Work keeps the buffers alive until MPI_Wait; synchronous calls use the blocking forms,
// since Open MPI's tuned blocking all_reduce measured ~1.7x faster than libnbc's non-blocking
// one for 16-64 MiB on 8 ranks here. Reductions support float32/64 and integer dtypes;
// bf16/fp16 reductions are rejected with a clear error (MPI has no native 16-bit float
// reduction), data movement (gather, all-to-all, broadcast) takes any dtype.
//
// Threading contract (MPI_THREAD_SERIALIZED): collectives and wait() are called from one
// thread at a time.
#include <mpi.h>

#include <memory>

#include "hyperpar/comm/communicator.h"

namespace hyperpar::comm {

class ShmCollectives;
enum class ShmKind : int;

class MpiCommunicator final : public Communicator {
 public:
  /// Takes ownership of `comm` (freed in the destructor unless it is MPI_COMM_WORLD).
  MpiCommunicator(MPI_Comm comm, std::vector<int64_t> ranks, int64_t global_rank,
                  std::string label);
  ~MpiCommunicator() override;
  const char* backend_name() const override { return "mpi"; }
  /// Where the group's shared-memory rings are on (one host, HYPERPAR_MPI_SHM not 0).
  std::shared_ptr<HostWindow> host_window(size_t bytes) override;

 protected:
  WorkHandle do_all_gather(at::Tensor out, at::Tensor in, bool async_op) override;
  WorkHandle do_reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op, bool async_op) override;
  WorkHandle do_all_reduce(at::Tensor t, ReduceOp op, bool async_op) override;
  WorkHandle do_all_reduce_into(at::Tensor out, at::Tensor in, ReduceOp op, bool async_op) override;
  WorkHandle do_all_to_all(at::Tensor out, at::Tensor in, const std::vector<int64_t>& out_rows,
                           const std::vector<int64_t>& in_rows, bool async_op) override;
  WorkHandle do_broadcast(at::Tensor t, int64_t root, bool async_op) override;
  WorkHandle do_barrier(bool async_op) override;
  WorkHandle do_send(at::Tensor t, int64_t peer, int64_t tag) override;
  WorkHandle do_recv(at::Tensor t, int64_t peer, int64_t tag, const std::string& what) override;

 private:
  MPI_Comm comm_;
  MPI_Comm fallback_comm_ = MPI_COMM_NULL;  // the rings' point-to-point fallback, apart
  std::unique_ptr<ShmCollectives> shm_;     // null when off or the ranks span hosts
  uint64_t shm_calls_ = 0;                  // ring operations issued (same on every rank)
  WorkHandle shm_work(ShmKind kind, at::Tensor out, at::Tensor in, bool average);
};

/// Initialises MPI once per process (MPI_Init_thread, SERIALIZED); finalises at exit.
void ensure_mpi_initialized();

/// Creates the communicator of `ranks` (global ranks, caller included). Collective over
/// the members only (MPI_Comm_create_group).
MPI_Comm create_mpi_comm(const std::vector<int64_t>& ranks);

}  // namespace hyperpar::comm
