#include "config_backend.h"

#include <yaml-cpp/yaml.h>

namespace hyperpar::launcher {

std::optional<ConfigBackend> config_backend(const std::vector<std::string>& args) {
  std::optional<std::string> path;
  std::optional<ConfigBackend> from_set;
  const std::string set_key = "comm.backend=";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--config" && i + 1 < args.size()) path = args[i + 1];
    if (a.rfind("--config=", 0) == 0) path = a.substr(9);
    std::string set;
    if (a == "--set" && i + 1 < args.size()) set = args[i + 1];
    if (a.rfind("--set=", 0) == 0) set = a.substr(6);
    if (set.rfind(set_key, 0) == 0)
      from_set = ConfigBackend{set.substr(set_key.size()), "--set " + set};
  }
  if (from_set) return from_set;
  if (!path) return std::nullopt;
  try {
    const YAML::Node root = YAML::LoadFile(*path);
    if (!root.IsMap() || !root["comm"] || !root["comm"].IsMap() || !root["comm"]["backend"])
      return std::nullopt;
    return ConfigBackend{root["comm"]["backend"].as<std::string>(), *path};
  } catch (const std::exception&) {
    return std::nullopt;  // the program reports its own config errors
  }
}

}  // namespace hyperpar::launcher
