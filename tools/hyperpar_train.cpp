// hyperpar-train: trains the configured Transformer on the launcher's world.
//
//   hyperpar-run --worker_num 8 -- hyperpar-train --config configs/tp2_ep2_fsdp.yaml
//   hyperpar-train --config configs/tp2_ep2_fsdp.yaml --dry-run --world-size 8 [--rank 5]
//
// Invalid configs are reported by every rank before any communication, with exit code 2.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "hyperpar/comm/run_main.h"
#include "hyperpar/train/trainer.h"

using namespace hyperpar;

namespace {

int64_t launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"})
    if (const char* s = std::getenv(v)) return std::atoll(s);
  return 1;
}

std::string json_shape(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string json_ranks(const std::vector<int64_t>& r) { return json_shape(r); }

void dry_run(train::Config c, int64_t world_size, int64_t only_rank) {
  std::cout << "{\"world_size\": " << world_size << ", \"mesh\": {\"names\": [\"dp_replicate\", "
            << "\"dp_shard\", \"tp\"], \"shape\": "
            << json_shape({c.parallel.dp_replicate, c.parallel.dp_shard, c.parallel.tp})
            << "}, \"ranks\": [";
  bool first = true;
  for (int64_t r = 0; r < world_size; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    auto pm = train::build_parallel_model(c, comm::World::simulated(r, world_size), false);
    int64_t param_bytes = 0;
    std::cout << (first ? "" : ",") << "\n {\"rank\": " << r << ", \"dp_rank\": " << pm.dp_rank
              << ", \"tp_group\": " << json_ranks(pm.tp_mesh->ranks())
              << ", \"dp_group\": " << json_ranks(pm.dp_mesh->ranks());
    if (pm.ep_mesh)
      std::cout << ", \"ep_mesh\": \"" << pm.ep_mesh->to_string()
                << "\", \"ep_group\": " << json_ranks(pm.ep_mesh->group_ranks(0))
                << ", \"expert_dp_group\": " << json_ranks(pm.expert_dp_mesh->ranks());
    std::cout << ", \"parameters\": [";
    bool pf = true;
    for (auto& [name, p] : pm.model->named_parameters()) {
      param_bytes += p->data.numel() * 4;
      std::cout << (pf ? "" : ",") << "\n  {\"name\": \"" << name
                << "\", \"global_shape\": " << json_shape(p->shape)
                << ", \"local_shape\": " << json_shape(p->data.sizes().vec())
                << ", \"placements\": \"" << dtensor::to_string(p->spec->placements())
                << "\", \"mesh\": \"" << p->spec->mesh().to_string() << "\"}";
      pf = false;
    }
    const int64_t state = c.train.optimizer == "adamw" ? 2 * param_bytes : param_bytes;
    std::cout << "],\n  \"memory_bytes\": {\"parameters\": " << param_bytes
              << ", \"gradients\": " << param_bytes << ", \"optimizer_state\": " << state
              << ", \"total\": " << 2 * param_bytes + state << "}}";
    first = false;
  }
  std::cout << "\n]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hyperpar-train: N-D parallel Transformer training"};
  std::string config_path, metrics;
  std::vector<std::string> sets;
  bool dry = false;
  int64_t world_size = -1, rank = -1;
  app.add_option("--config", config_path, "YAML config (see configs/)")->required();
  app.add_option("--set", sets, "override, e.g. --set train.steps=5 (repeatable)");
  app.add_option("--metrics", metrics, "write one JSON object per step here (rank 0)");
  app.add_flag("--dry-run", dry, "print meshes, placements, shapes and memory; launch nothing");
  app.add_option("--world-size", world_size, "dry run: world size");
  app.add_option("--rank", rank, "dry run: only this rank");
  CLI11_PARSE(app, argc, argv);
  train::Config cfg;
  const int64_t ws = dry ? (world_size > 0 ? world_size : 1) : launcher_world_size();
  try {
    cfg = train::load_config(config_path, sets);
    train::validate(cfg, ws);
    if (dry && (rank < -1 || rank >= ws))
      throw train::ConfigError("--rank " + std::to_string(rank) + " is outside the world [0, " +
                               std::to_string(ws) + ")");
  } catch (const train::ConfigError& e) {
    std::cerr << "hyperpar-train: " << e.what() << "\n";
    std::cerr.flush();
    // Every rank finds the same error before any communication. A launcher stops the job at
    // the first non-zero exit, so give slower peers a moment to report theirs as well.
    if (!dry && ws > 1) std::this_thread::sleep_for(std::chrono::seconds(5));
    return 2;
  }
  if (dry) {
    dry_run(cfg, ws, rank);
    return 0;
  }
  if (!std::getenv("HYPERPAR_BACKEND") && ws > 1)
    setenv("HYPERPAR_BACKEND", cfg.backend.c_str(), 0);
  return comm::run_main([&] {
    auto world = comm::World::from_env();
    HP_CHECK(world->size() == ws, "world size ", world->size(), " does not match ", ws);
    auto pm = train::build_parallel_model(cfg, world);
    if (world->rank() == 0)
      std::cout << "hyperpar-train: " << config_path << " on " << world->size() << " ranks ("
                << to_string(world->backend()) << "), mesh (dp_replicate, dp_shard, tp) = ("
                << cfg.parallel.dp_replicate << ", " << cfg.parallel.dp_shard << ", "
                << cfg.parallel.tp << "), " << cfg.model.num_parameters()
                << " parameters, peak RSS " << train::peak_rss_mb()
                << " MiB after materialisation\n";
    train::run_training(cfg, pm, *world, metrics);
    return 0;
  });
}
