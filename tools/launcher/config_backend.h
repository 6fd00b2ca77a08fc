#pragma once
// The launcher's view of a program's config: comm.backend of `--config PATH` (or
// `--config=PATH`) in the program's arguments, overridden by `--set comm.backend=V`.
// nullopt when the program names no config or its config sets no backend; an unreadable
// config is left to the program to report.
#include <optional>
#include <string>
#include <vector>

namespace hyperpar::launcher {

struct ConfigBackend {
  std::string backend;
  std::string source;  // "configs/a.yaml" or "--set comm.backend=gloo"
};

std::optional<ConfigBackend> config_backend(const std::vector<std::string>& program_args);

}  // namespace hyperpar::launcher
