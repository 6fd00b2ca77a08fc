#pragma once
// Worker records: small key=value files through which a worker, its launcher shim and the
// launcher tell each other how a worker ended (header-only: hyperpar-run reads them without
// linking the library).
//
//   LOG_DIR/worker_R.error  written by the program (run_main) when it fails:
//       kind=error|peer|timeout|config   time_ns=<CLOCK_REALTIME>   message=<first line>
//   LOG_DIR/worker_R.exit   written by the shim when the program has ended:
//       how=exit|signal  code=<exit code or 128+sig>  signal=<n>  stopped=0|1  time_ns=...
//   LOG_DIR/worker_R.pid    written by the shim at start: shim=<pid> program=<pid>
//
// "peer" and "timeout" errors are consequences of another worker's failure (a closed
// connection, a collective that never completed); "stopped=1" means the shim was told to
// stop the worker (by the launcher, mpirun or a signal) before it ended.
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

namespace hyperpar::record {

using Record = std::map<std::string, std::string>;

inline int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

/// Writes `r` to `path` through a temporary file and rename, so a reader never sees half.
inline bool write(const std::string& path, const Record& r) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return false;
    for (const auto& [k, v] : r) {
      std::string line = v;
      for (char& c : line)
        if (c == '\n' || c == '\r') c = ' ';
      f << k << "=" << line << "\n";
    }
    if (!f.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

/// Reads a record; empty when the file does not exist.
inline Record read(const std::string& path) {
  Record r;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) r[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return r;
}

inline std::string path(const std::string& log_dir, int64_t rank, const char* kind) {
  return log_dir + "/worker_" + std::to_string(rank) + "." + kind;
}

}  // namespace hyperpar::record
