#include "hyperpar/comm/local_communicator.h"

#include <ATen/ATen.h>

namespace hyperpar::comm {
namespace {
WorkHandle done() { return std::make_shared<CompletedWork>(); }
void copy_flat(at::Tensor& out, const at::Tensor& in) {
  if (out.data_ptr() != in.data_ptr()) out.view({-1}).copy_(in.reshape({-1}));
}
}  // namespace

LocalCommunicator::LocalCommunicator(int64_t global_rank, std::string label)
    : Communicator({global_rank}, global_rank, std::move(label)) {}

WorkHandle LocalCommunicator::do_all_gather(at::Tensor out, at::Tensor in, bool) {
  copy_flat(out, in);
  return done();
}
WorkHandle LocalCommunicator::do_reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp, bool) {
  copy_flat(out, in);  // sum, avg, max and min of one value are that value
  return done();
}
WorkHandle LocalCommunicator::do_all_reduce(at::Tensor, ReduceOp, bool) { return done(); }
WorkHandle LocalCommunicator::do_all_to_all(at::Tensor out, at::Tensor in,
                                            const std::vector<int64_t>&,
                                            const std::vector<int64_t>&, bool) {
  copy_flat(out, in);
  return done();
}
WorkHandle LocalCommunicator::do_broadcast(at::Tensor, int64_t, bool) { return done(); }
WorkHandle LocalCommunicator::do_barrier(bool) { return done(); }
// A one-rank group has no peer: check_peer rejects every send/recv before these.
WorkHandle LocalCommunicator::do_send(at::Tensor, int64_t, int64_t) { return done(); }
WorkHandle LocalCommunicator::do_recv(at::Tensor, int64_t, int64_t, const std::string&) {
  return done();
}

}  // namespace hyperpar::comm
