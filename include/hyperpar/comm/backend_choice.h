#pragma once
// Which collective backend a job runs on, decided in one place for the launcher and the
// trainer. Sources, strongest first:
//   started_by  the process was started by plain mpirun (mpi) or torchrun (gloo)
//   flag        hyperpar-run --backend
//   config      the config's comm.backend
// A source that is not given does not vote; none given means mpi. Two given sources that
// disagree are an error naming both (the caller reports it with exit code 2):
//
//   flag "gloo", config "mpi" from configs/a.yaml
//     -> throws "--backend gloo conflicts with comm.backend: mpi in configs/a.yaml; ..."
//   config "gloo" only -> "gloo";  nothing given -> "mpi"
#include <optional>
#include <stdexcept>
#include <string>

namespace hyperpar::comm {

struct BackendRequest {
  std::optional<std::string> started_by;  // "mpi" under plain mpirun, "gloo" under torchrun
  std::string started_by_name;            // "mpirun" / "torchrun", for the message
  std::optional<std::string> flag;        // hyperpar-run --backend
  std::optional<std::string> config;      // comm.backend
  std::string config_source;              // where comm.backend was read
};

class BackendConflict : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline std::string choose_backend(const BackendRequest& r) {
  const std::string config_text =
      r.config ? "comm.backend: " + *r.config +
                     (r.config_source.empty() ? std::string() : " in " + r.config_source)
               : std::string();
  if (r.started_by && r.flag && *r.started_by != *r.flag)
    throw BackendConflict("started by " + r.started_by_name + " (" + *r.started_by +
                          ") but --backend " + *r.flag + " was asked for");
  if (r.started_by && r.config && *r.started_by != *r.config)
    throw BackendConflict(config_text + " conflicts with the launcher: started by " +
                          r.started_by_name + ", which runs " + *r.started_by +
                          " (use hyperpar-run --backend " + *r.config + ")");
  if (r.flag && r.config && *r.flag != *r.config)
    throw BackendConflict("--backend " + *r.flag + " conflicts with " + config_text +
                          "; drop one or make them agree");
  if (r.started_by) return *r.started_by;
  if (r.flag) return *r.flag;
  if (r.config) return *r.config;
  return "mpi";
}

}  // namespace hyperpar::comm
