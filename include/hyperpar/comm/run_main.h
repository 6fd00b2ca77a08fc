#pragma once
// run_main: the top level of every hyperpar program. Runs `body` with stdout line-buffered
// (each line reaches the launcher's console and the log when it is printed) and stderr
// unbuffered. On an exception or a non-zero result it prints the error as the last line,
// records it for the launcher (core/worker_record.h: HYPERPAR_ERROR_RECORD, with its kind:
// "config" for a UsageError, exit code 2; "peer" for a PeerError; else "error", code 1)
// and, when MPI is up, calls MPI_Abort so that peers blocked in a collective are torn down
// instead of hanging (a plain return would reach MPI_Finalize, which waits for them);
// without MPI it exits at once (_Exit).
//
//   int main(int argc, char** argv) { return hyperpar::comm::run_main([&] { ...; return 0; }); }
#include <functional>
#include <string>

namespace hyperpar::comm {

int run_main(const std::function<int()>& body);

/// Makes stdout line-buffered and installs the terminate handler (run_main does this; a
/// program that reports errors before run_main calls it first).
void prepare_process_output();

/// Records an error for the launcher (HYPERPAR_ERROR_RECORD) without exiting: for programs
/// that report a usage error themselves before run_main.
void record_error(const std::string& kind, const std::string& message);

/// Prints "error: <message>", records it (kind: error|peer|timeout|config) and exits the
/// process with `code` at once, from any thread: used by the collective watchdog, whose
/// stuck peers cannot be joined. Never returns.
[[noreturn]] void exit_with_fatal_error(const std::string& kind, const std::string& message,
                                        int code);

}  // namespace hyperpar::comm
