#pragma once
// LocalCommunicator: the group of one rank. Every collective is a local copy (or nothing),
// with the same contract checks as a real backend. Used for size-1 mesh dims and for
// single-process and simulated worlds.
#include "hyperpar/comm/communicator.h"

namespace hyperpar::comm {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(int64_t global_rank, std::string label);
  const char* backend_name() const override { return "local"; }

 protected:
  WorkHandle do_all_gather(at::Tensor out, at::Tensor in, bool async_op) override;
  WorkHandle do_reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op, bool async_op) override;
  WorkHandle do_all_reduce(at::Tensor t, ReduceOp op, bool async_op) override;
  WorkHandle do_all_to_all(at::Tensor out, at::Tensor in, const std::vector<int64_t>& out_rows,
                           const std::vector<int64_t>& in_rows, bool async_op) override;
  WorkHandle do_broadcast(at::Tensor t, int64_t root, bool async_op) override;
  WorkHandle do_barrier(bool async_op) override;
  WorkHandle do_send(at::Tensor t, int64_t peer, int64_t tag) override;
  WorkHandle do_recv(at::Tensor t, int64_t peer, int64_t tag, const std::string& what) override;
};

}  // namespace hyperpar::comm
