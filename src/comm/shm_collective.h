#pragma once
// ShmCollectives: a group's all-gathers, sum reduce-scatters and sum all-reduces through its
// ranks' shared-memory rings (shm_ring.h), for any backend whose group shares one host (gloo
// and MPI; internal to comm/). Issuing an operation copies this rank's contribution into its
// ring and publishes a note: nothing more has to happen on this rank for its peers to read
// it, so an async collective makes progress while this rank computes (MPI's non-blocking
// collectives move only inside MPI calls). Waiting reads each peer's contribution from that
// peer's ring. Reductions add the n contributions in rank order: deterministic, and an
// all-reduce's result is bitwise the same on every rank. An operation that finds no room in
// its sender's ring goes over the backend's point-to-point messages (`Fallback`) instead.
//
//   ShmCollectives shm(std::move(ring), size(), rank(), {send_fn, recv_fn});
//   WorkHandle w = shm.start(ShmCollectives::Kind::kReduceScatter, out, in, call, tag, {});
//   w->wait();  // out holds the sum of every rank's chunk `rank()` of in
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "hyperpar/comm/work.h"
#include "shm_ring.h"

namespace hyperpar::comm {

/// Whether a backend's groups use shared-memory rings and how large each rank's ring is:
/// HYPERPAR_<PREFIX>_SHM=0 turns them off; HYPERPAR_<PREFIX>_SHM_BYTES sets the ring size
/// (default 64 MiB). PREFIX is GLOO or MPI.
struct ShmSettings {
  bool enabled = true;
  size_t ring_bytes = size_t{64} << 20;
};
ShmSettings shm_settings(const std::string& prefix);

enum class ShmKind : int { kAllGather, kReduceScatter, kAllReduce };

class ShmCollectives {
 public:
  using Kind = ShmKind;
  /// The backend's point-to-point messages, for operations that found no room in a ring.
  struct Fallback {
    /// Starts sending the bytes (uint8, contiguous) to group rank `peer` as message `tag`.
    std::function<WorkHandle(const at::Tensor& bytes, int64_t peer, int tag)> send;
    /// Receives exactly `bytes.numel()` bytes from `peer`, message `tag`; blocks until done.
    std::function<void(const at::Tensor& bytes, int64_t peer, int tag)> recv;
  };

  ShmCollectives(std::unique_ptr<ShmRing> ring, int64_t size, int64_t rank, Fallback fallback);
  bool enabled() const { return ring_ && ring_->enabled(); }
  /// Whether a sum all-reduce of `bytes` goes through the rings: when each rank reading every
  /// peer's whole tensor stays cheap (few ranks, as TP groups, or small tensors); else the
  /// backend's own algorithm. Depends only on the call, so every rank decides alike.
  bool takes_all_reduce(int64_t bytes) const {
    return enabled() && bytes > 0 && (size_ <= 4 || bytes <= (int64_t{256} << 10));
  }

  /// Starts one operation; `call` numbers it (the same on every rank of the group: its ring
  /// slot) and `tag` is its fallback messages' tag. All-gather: out/in as bytes. Reduce-scatter:
  /// flat out and in. All-reduce: flat out and in, the same tensor (in place) or not (`in`
  /// left unchanged). `average` (reductions): the sum divided by the group size, as one
  /// division of each summed element (float32/float64: while the sum is stored, no second
  /// pass; float16/bfloat16: after it is stored in that dtype, as a division of `out` would).
  WorkHandle start(Kind kind, at::Tensor out, at::Tensor in, uint64_t call, int tag, bool average);

 private:
  std::unique_ptr<ShmRing> ring_;
  int64_t size_, rank_;
  Fallback fallback_;
};

}  // namespace hyperpar::comm
