#include "hyperpar/comm/run_main.h"

#include <mpi.h>

#include <cstdlib>
#include <fstream>
#include <iostream>

namespace hyperpar::comm {
namespace {
int fail(int code) {
  if (const char* marker = std::getenv("HYPERPAR_FAIL_MARKER"))
    std::ofstream(marker) << code << "\n";
  std::cerr.flush();
  std::cout.flush();
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  // Without MPI (gloo, local): exit at once. Normal teardown would run the destructors of
  // backends whose worker threads may be blocked on peers; the launcher stops the peers.
  std::_Exit(code);
}
}  // namespace

int run_main(const std::function<int()>& body) {
  try {
    const int code = body();
    return code == 0 ? 0 : fail(code);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return fail(1);
  }
}

}  // namespace hyperpar::comm
