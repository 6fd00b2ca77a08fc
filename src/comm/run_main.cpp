#include "hyperpar/comm/run_main.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <mutex>

#include "hyperpar/core/error.h"
#include "hyperpar/core/stop_request.h"
#include "hyperpar/core/worker_record.h"

namespace hyperpar::comm {
void record_error(const std::string& kind, const std::string& message) {
  const char* path = std::getenv("HYPERPAR_ERROR_RECORD");
  if (!path || !*path) return;
  const auto nl = message.find('\n');
  record::write(path, {{"kind", kind},
                       {"time_ns", std::to_string(record::now_ns())},
                       {"message", message.substr(0, nl == std::string::npos ? 400 : nl)}});
}

namespace {

void flush_all() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

// The first fatal error wins; a second one (another thread) waits for the exit.
std::mutex& fatal_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

[[noreturn]] void fail(const std::string& kind, const std::string& message, int code,
                       bool may_abort_mpi) {
  fatal_mutex().lock();
  // On a terminal a progress line may be drawn without a newline: start a fresh line.
  const bool tty = isatty(STDERR_FILENO) || std::getenv("HYPERPAR_CONSOLE_TTY");
  std::cerr << (tty ? "\n" : "") << "error: " << message << "\n";
  record_error(kind, message);
  flush_all();
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (may_abort_mpi && inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  // Without MPI (gloo, local), or from a helper thread: exit at once. Normal teardown would
  // run the destructors of backends whose threads may be blocked on peers; the launcher
  // (or mpirun) stops the peers.
  std::_Exit(code);
}

}  // namespace

void prepare_process_output() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::setvbuf(stderr, nullptr, _IONBF, 0);
  std::set_terminate([] {
    std::string what = "terminate called without an active exception";
    if (auto e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = std::string("uncaught exception: ") + ex.what();
      } catch (...) {
        what = "uncaught exception of unknown type";
      }
    }
    fail("error", what, 1, false);
  });
}

void exit_with_fatal_error(const std::string& kind, const std::string& message, int code) {
  fail(kind, message, code, false);
}

int run_main(const std::function<int()>& body) {
  prepare_process_output();
  try {
    const int code = body();
    if (code == 0) {
      flush_all();
      return 0;
    }
    fail("error", "exited with code " + std::to_string(code), code, true);
  } catch (const StopRequest& e) {
    // Every rank stops at the same point (e.g. after a collective save): exit quietly.
    std::cout << e.what() << std::endl;
    record_error("stopped", e.what());
    flush_all();
    std::_Exit(e.exit_code);
  } catch (const UsageError& e) {
    fail("config", e.what(), 2, true);
  } catch (const PeerError& e) {
    fail("peer", e.what(), 1, true);
  } catch (const std::exception& e) {
    fail("error", e.what(), 1, true);
  }
}

}  // namespace hyperpar::comm
