#pragma once
// World: this process's rank and the world size, real or simulated, and the one place that
// creates communicators. group(ranks) returns one communicator per distinct rank set: the
// same ranks always map to the same (cached) communicator.
//
//   auto w = World::simulated(5, 8);   // rank 5 of 8, no process launched, no communicator
//   auto w = World::from_env();        // from the launcher's environment, see below
//
// A simulated world hands out only single-rank groups (local copies); asking it for a
// larger group throws, since no peer processes exist.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyperpar/comm/communicator.h"

namespace hyperpar::comm {

enum class Backend { kSimulated, kLocal, kMpi, kGloo };
const char* to_string(Backend b);

class World {
 public:
  static std::shared_ptr<World> simulated(int64_t rank, int64_t size);
  /// The process world from the launcher's environment (cached per process):
  ///   HYPERPAR_BACKEND=mpi|gloo (set by hyperpar-run) wins; otherwise mpirun's variables
  ///   mean MPI, and RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT without MPI (torchrun) mean
  ///   gloo; with no launcher variables the world is one local rank.
  static std::shared_ptr<World> from_env();

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  Backend backend() const { return backend_; }
  bool is_simulated() const { return backend_ == Backend::kSimulated; }

  /// The communicator of `ranks` (ordered global ranks containing this rank). Collective
  /// over the members the first time it is asked for a rank set: all members must ask
  /// for the same sets in the same order.
  std::shared_ptr<Communicator> group(const std::vector<int64_t>& ranks, const std::string& label);
  /// Number of distinct communicators created so far.
  size_t num_groups() const { return groups_.size(); }

 private:
  World(int64_t rank, int64_t size, Backend backend);
  int64_t rank_, size_;
  Backend backend_;
  std::map<std::vector<int64_t>, std::shared_ptr<Communicator>> groups_;
};

}  // namespace hyperpar::comm
