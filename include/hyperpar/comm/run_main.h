#pragma once
// run_main: the top level of every hyperpar program. Runs `body`; on an exception or a
// non-zero result it prints the error, records the failure for the launcher (the file
// named by HYPERPAR_FAIL_MARKER, set by hyperpar-run) and, when MPI is up, calls MPI_Abort
// so that peers blocked in a collective are torn down instead of hanging (a plain return
// would reach MPI_Finalize, which waits for them); without MPI it exits at once (_Exit).
//
//   int main(int argc, char** argv) { return hyperpar::comm::run_main([&] { ...; return 0; }); }
#include <functional>

namespace hyperpar::comm {

int run_main(const std::function<int()>& body);

}  // namespace hyperpar::comm
