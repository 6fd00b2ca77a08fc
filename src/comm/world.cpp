#include "hyperpar/comm/world.h"

#include <cstdlib>
#include <sstream>

#include "hyperpar/comm/c10d_communicator.h"
#include "hyperpar/comm/local_communicator.h"
#include "hyperpar/comm/mpi_communicator.h"
#include "hyperpar/comm/watchdog.h"
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

const char* to_string(Backend b) {
  switch (b) {
    case Backend::kSimulated:
      return "simulated";
    case Backend::kLocal:
      return "local";
    case Backend::kMpi:
      return "mpi";
    case Backend::kGloo:
      return "gloo";
  }
  return "?";
}

namespace {
int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  HP_CHECK(v && *v, name,
           " is not set; the gloo backend needs RANK, WORLD_SIZE, MASTER_ADDR and "
           "MASTER_PORT (start the program with hyperpar-run --backend gloo or torchrun)");
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    throw Error(detail::concat(name, "=", v, " is not an integer"));
  }
}
}  // namespace

std::shared_ptr<World> World::from_env() {
  static std::shared_ptr<World> world = [] {
    const char* backend = std::getenv("HYPERPAR_BACKEND");
    const bool under_mpi =
        std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
    const bool under_c10d_launcher = std::getenv("RANK") && std::getenv("WORLD_SIZE") &&
                                     std::getenv("MASTER_ADDR") && std::getenv("MASTER_PORT");
    std::string b = backend ? backend : (under_mpi ? "mpi" : under_c10d_launcher ? "gloo" : "");
    if (b.empty()) {
      const char* ws = std::getenv("WORLD_SIZE");
      HP_CHECK(!ws || std::string(ws) == "1", "WORLD_SIZE=", ws,
               " is set but no supported launcher was detected (RANK, MASTER_ADDR and "
               "MASTER_PORT are missing); start the program with hyperpar-run, mpirun or "
               "torchrun --no-python");
      return std::shared_ptr<World>(new World(0, 1, Backend::kLocal));
    }
    HP_CHECK(b == "mpi" || b == "gloo", "HYPERPAR_BACKEND=", b,
             " is not supported; expected mpi or gloo");
    if (b == "gloo") {
      HP_CHECK(gloo_available(),
               "HYPERPAR_BACKEND=gloo, but this build has no gloo backend "
               "(install libgloo-dev and reconfigure)");
      return std::shared_ptr<World>(
          new World(env_int("RANK"), env_int("WORLD_SIZE"), Backend::kGloo));
    }
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
  // The rendezvous store has its own bounded wait, whose error names the master's address.
  if (backend_ == Backend::kGloo && ranks.size() > 1) connect_gloo_store();
  // Creating a group is collective over its members: a member that never arrives is caught.
  WatchScope watched("creating the communicator of " + label + " (" + to_string(backend_) + ")");
  if (ranks.size() == 1) {
    HP_CHECK(ranks[0] == rank_, "rank ", rank_, " asked for the group of rank ", ranks[0]);
    comm = std::make_shared<LocalCommunicator>(rank_, label);
  } else {
    HP_CHECK(backend_ == Backend::kMpi || backend_ == Backend::kGloo, "a ",
             (is_simulated() ? "simulated" : "single-process"),
             " world has no peers: cannot create the ", ranks.size(), "-rank communicator of ",
             label);
    if (backend_ == Backend::kGloo)
      comm = make_gloo_communicator(ranks, rank_, label);
    else
      comm = std::make_shared<MpiCommunicator>(create_mpi_comm(ranks), ranks, rank_, label);
  }
  groups_.emplace(ranks, comm);
  return comm;
}

}  // namespace hyperpar::comm
