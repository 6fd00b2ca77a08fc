#pragma once
// Communicator: collectives over one fixed, ordered list of global ranks.
//
// Every public call first runs the contract checks of contract.h on the caller's thread,
// so a bad buffer throws ContractError at the call site, before anything is enqueued;
// only then does the backend's do_* run. Backends never see an unchecked buffer.
//
// The communicator knows rank lists, not meshes; DeviceMesh passes a readable label
// (its dim names and ranks) that error messages print.
//
// Semantics (PyTorch c10d names):
//   all_gather_into_tensor(out, in): out = concat over group ranks of in (out = size x in)
//   reduce_scatter_tensor(out, in, op): in = size x out; rank i gets the reduced chunk i
//   all_reduce(t, op): in place
//   all_reduce_into(out, in, op): out = the reduction of every rank's in; in unchanged (what
//     a caller that must keep its input would otherwise clone first)
//   all_to_all_single(out, in, out_splits, in_splits): dim-0 rows; empty splits = equal
//   broadcast(t, root): root is a group rank (index into ranks())
//   send(t, peer) / recv(t, peer): point to point with group rank `peer` (not this rank);
//     the receiver's buffer has the shape and dtype it expects (pipelines derive them from
//     the config, so no metadata travels): a message of another size is an error naming the
//     recv, raised by its wait (MPI probes the message; gloo, which would abort on a size
//     mismatch, sends an 8-byte size before each message). opts.message_tag pairs them.
// Average is computed as a sum followed by one division by the group size at completion,
// so fp32 averages round once (no per-rank pre-scaling).
//
// A returned Work keeps the call's tensors alive until it completes: callers may drop theirs.
//
// Every collective is watched (watchdog.h) from enqueue to completion: one that does not
// complete within the current timeout ends the process with an error naming it.
//
// Threading contract: one thread issues collectives on a communicator and waits on their
// Work; all group members issue the same collectives in the same order.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hyperpar/comm/contract.h"
#include "hyperpar/comm/host_window.h"
#include "hyperpar/comm/options.h"
#include "hyperpar/comm/watchdog.h"
#include "hyperpar/comm/work.h"

namespace hyperpar::comm {

class Communicator {
 public:
  Communicator(std::vector<int64_t> ranks, int64_t global_rank, std::string label);
  virtual ~Communicator() = default;

  const std::vector<int64_t>& ranks() const { return ranks_; }
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  /// This process's index in ranks().
  int64_t rank() const { return group_rank_; }
  /// Readable group description for error messages, e.g. "mesh dim tp ranks [4, 5, 6, 7]".
  const std::string& label() const { return label_; }
  /// Adds another name under which this rank set is used (shared communicators).
  void add_label(const std::string& label);
  virtual const char* backend_name() const = 0;

  WorkHandle all_gather_into_tensor(at::Tensor out, const at::Tensor& in,
                                    const CollectiveOptions& opts = {});
  WorkHandle reduce_scatter_tensor(at::Tensor out, const at::Tensor& in, ReduceOp op,
                                   const CollectiveOptions& opts = {});
  WorkHandle all_reduce(at::Tensor t, ReduceOp op, const CollectiveOptions& opts = {});
  /// Same shape and dtype; `out` may be `in` itself (in place) but not overlap it otherwise.
  WorkHandle all_reduce_into(at::Tensor out, const at::Tensor& in, ReduceOp op,
                             const CollectiveOptions& opts = {});
  WorkHandle all_to_all_single(at::Tensor out, const at::Tensor& in,
                               std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                               const CollectiveOptions& opts = {});
  WorkHandle broadcast(at::Tensor t, int64_t root, const CollectiveOptions& opts = {});
  WorkHandle barrier(const CollectiveOptions& opts = {});
  WorkHandle send(const at::Tensor& t, int64_t peer, const CollectiveOptions& opts = {});
  WorkHandle recv(at::Tensor t, int64_t peer, const CollectiveOptions& opts = {});

  /// An operation made outside this class's collectives (FSDP's host-shared gathers,
  /// host_window.h) watched and profiled as one of them: registered with the collective
  /// watchdog until `inner` completes, under watch_name(op, tag, note), and drawn as `op` on
  /// the profiler's collectives-in-flight track (its blocking wait on the main track).
  WorkHandle watched(WorkHandle inner, const std::string& op, const std::string& tag,
                     const std::string& note) const;
  /// How the watchdog names an operation of this group: "<op> on <label> (<backend>) ranks
  /// [..], tag '<tag>'<note>" (the ranks only where the label does not list them).
  std::string watch_name(const std::string& op, const std::string& tag,
                         const std::string& note = "") const;

  /// A shared-memory window of `bytes` over this group (host_window.h). Collective: every
  /// rank of the group calls it, in the same order relative to its other window requests.
  /// nullptr (on every rank alike) where the group's ranks are not all on one host, the
  /// backend's shared memory is off (HYPERPAR_<BACKEND>_SHM=0) or the backend has none.
  virtual std::shared_ptr<HostWindow> host_window(size_t bytes);

 protected:
  // Backends: buffers are already checked; splits are already expanded to rows per rank.
  // async_op false: the caller waits at once, so a backend may use a blocking call.
  virtual WorkHandle do_all_gather(at::Tensor out, at::Tensor in, bool async_op) = 0;
  virtual WorkHandle do_reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op,
                                       bool async_op) = 0;
  virtual WorkHandle do_all_reduce(at::Tensor t, ReduceOp op, bool async_op) = 0;
  /// Backends with a native out-of-place form override this; by default `in` is copied into
  /// `out`, which is then reduced in place. `out` and `in` are distinct here.
  virtual WorkHandle do_all_reduce_into(at::Tensor out, at::Tensor in, ReduceOp op, bool async_op);
  virtual WorkHandle do_all_to_all(at::Tensor out, at::Tensor in,
                                   const std::vector<int64_t>& out_rows,
                                   const std::vector<int64_t>& in_rows, bool async_op) = 0;
  virtual WorkHandle do_broadcast(at::Tensor t, int64_t root, bool async_op) = 0;
  virtual WorkHandle do_barrier(bool async_op) = 0;
  /// peer is a group rank; `what` names the call for errors found at completion.
  virtual WorkHandle do_send(at::Tensor t, int64_t peer, int64_t tag) = 0;
  virtual WorkHandle do_recv(at::Tensor t, int64_t peer, int64_t tag, const std::string& what) = 0;
  /// Device type this backend's buffers must live on.
  virtual c10::DeviceType device_type() const { return c10::kCPU; }

 private:
  CallSite site(const char* op, const CollectiveOptions& opts) const;
  /// Registers the collective with the watchdog (watchdog.h) until its Work completes.
  uint64_t watch(const CallSite& site) const;
  /// `began`: when the call was issued (profiler time, core/profiler.h).
  static WorkHandle finish(WorkHandle work, WatchScope& watched, const CollectiveOptions& opts,
                           const CallSite& site, int64_t began);
  void check_reduce_dtype(const CallSite& site, const at::Tensor& t, ReduceOp op) const;
  void check_peer(const CallSite& site, int64_t peer, int64_t tag) const;

  std::vector<int64_t> ranks_;
  int64_t group_rank_;
  std::string label_;
};

}  // namespace hyperpar::comm
