#include "hyperpar/comm/world.h"

#include <cstdlib>
#include <sstream>

#include "hyperpar/comm/local_communicator.h"
#include "hyperpar/comm/mpi_communicator.h"
#include "hyperpar/core/error.h"

namespace hyperpar::comm {

World::World(int64_t rank, int64_t size, Backend backend)
    : rank_(rank), size_(size), backend_(backend) {
  HP_CHECK(size > 0, "world size must be positive, got ", size);
  HP_CHECK(rank >= 0 && rank < size, "rank ", rank, " is outside the world [0, ", size, ")");
}

std::shared_ptr<World> World::simulated(int64_t rank, int64_t size) {
  return std::shared_ptr<World>(new World(rank, size, Backend::kSimulated));
}

std::shared_ptr<World> World::from_env() {
  static std::shared_ptr<World> world = [] {
    const char* backend = std::getenv("HYPERPAR_BACKEND");
    const bool under_mpi =
        std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
    std::string b = backend ? backend : (under_mpi ? "mpi" : "");
    if (b.empty()) {
      const char* ws = std::getenv("WORLD_SIZE");
      HP_CHECK(!ws || std::string(ws) == "1", "WORLD_SIZE=", ws,
               " is set but no supported launcher was detected; start the program with "
               "hyperpar-run --backend mpi or mpirun (the c10d/gloo backend is not built yet)");
      return std::shared_ptr<World>(new World(0, 1, Backend::kLocal));
    }
    HP_CHECK(b == "mpi", "HYPERPAR_BACKEND=", b, " is not supported; expected mpi");
    ensure_mpi_initialized();
    int r = 0, s = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return std::shared_ptr<World>(new World(r, s, Backend::kMpi));
  }();
  return world;
}

std::shared_ptr<Communicator> World::group(const std::vector<int64_t>& ranks,
                                           const std::string& label) {
  auto it = groups_.find(ranks);
  if (it != groups_.end()) {
    it->second->add_label(label);
    return it->second;
  }
  HP_CHECK(!ranks.empty(), "cannot create a communicator for an empty rank set (", label, ")");
  std::shared_ptr<Communicator> comm;
  if (ranks.size() == 1) {
    HP_CHECK(ranks[0] == rank_, "rank ", rank_, " asked for the group of rank ", ranks[0]);
    comm = std::make_shared<LocalCommunicator>(rank_, label);
  } else {
    HP_CHECK(backend_ == Backend::kMpi, "a ", (is_simulated() ? "simulated" : "single-process"),
             " world has no peers: cannot create the ", ranks.size(), "-rank communicator of ",
             label);
    comm = std::make_shared<MpiCommunicator>(create_mpi_comm(ranks), ranks, rank_, label);
  }
  groups_.emplace(ranks, comm);
  return comm;
}

}  // namespace hyperpar::comm
