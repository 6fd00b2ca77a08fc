// hyperpar-train: trains the configured Transformer on the launcher's world.
//
//   hyperpar-run --worker_num 8 build/tools/hyperpar-train --config configs/tp2_ep2_fsdp.yaml
//   hyperpar-train --config configs/tp2_ep2_fsdp.yaml --dry-run --world-size 8 [--rank 5]
//
// Invalid configs (and command lines, metrics paths, layouts that do not fit in memory) are
// reported by every rank before any communication, with exit code 2.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "hyperpar/checkpoint/hf_import.h"
#include "hyperpar/comm/backend_choice.h"
#include "hyperpar/comm/run_main.h"
#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/format.h"
#include "hyperpar/core/malloc_tuning.h"
#include "hyperpar/nn/safetensors.h"
#include "hyperpar/parallel/pipeline/simulator.h"
#include "hyperpar/train/memory_estimate.h"
#include "hyperpar/train/model_export.h"
#include "hyperpar/train/output_path.h"
#include "hyperpar/train/trainer.h"

using namespace hyperpar;

namespace {

int64_t env_int(std::initializer_list<const char*> names, int64_t fallback) {
  for (const char* v : names)
    if (const char* s = std::getenv(v)) return std::atoll(s);
  return fallback;
}

int64_t launcher_world_size() {
  return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"}, 1);
}
int64_t launcher_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"}, 0); }
int64_t local_world_size() {
  return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}, launcher_world_size());
}

std::string json_bytes(double b) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(0);
  os << b;
  return os.str();
}

// Prints nothing until every rank is built: an error leaves no half-written JSON.
void dry_run(train::Config c, int64_t world_size, int64_t only_rank) {
  std::ostringstream out;
  const auto& par = c.parallel;
  const bool pipelined = par.pp > 1;
  out << "{\"world_size\": " << world_size << ", \"mesh\": {\"names\": ["
      << (pipelined ? "\"pp\", " : "") << "\"dp_replicate\", \"dp_shard\", \"tp\"], \"shape\": "
      << format_list(pipelined
                         ? std::vector<int64_t>{par.pp, par.dp_replicate, par.dp_shard, par.tp}
                         : std::vector<int64_t>{par.dp_replicate, par.dp_shard, par.tp})
      << "}";
  parallel::pipeline::RankActions schedule;
  if (pipelined) {
    namespace pl = parallel::pipeline;
    const auto spec = train::pipeline_spec(c);
    schedule = pl::lowered_schedule(spec, true);
    const auto sim = pl::simulate(schedule, spec);
    if (!sim.ok()) throw Error("pipeline schedule is invalid: " + sim.problems.front());
    out << ", \"pipeline\": {\"schedule\": \"" << pl::schedule_name(spec.kind)
        << "\", \"pp\": " << spec.pp << ", \"virtual_stages\": " << spec.virtual_stages
        << ", \"microbatches\": " << spec.microbatches
        << ", \"bubble_fraction\": " << sim.bubble_fraction << ", \"stages\": [";
    const auto split = pl::split_layers(c.model.n_layers, spec.stages(), par.pp_split);
    for (size_t st = 0; st < split.size(); ++st)
      out << (st ? ", " : "") << "{\"stage\": " << st
          << ", \"pp_rank\": " << pl::rank_of_stage(static_cast<int64_t>(st), spec.pp)
          << ", \"layers\": " << format_list({split[st].first, split[st].end})
          << ", \"embedding\": " << (split[st].embedding ? "true" : "false")
          << ", \"head\": " << (split[st].head ? "true" : "false") << "}";
    out << "]}";
  }
  out << ", \"ranks\": [";
  bool first = true;
  for (int64_t r = 0; r < world_size; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    auto pm = train::build_parallel_model(c, comm::World::simulated(r, world_size), false);
    out << (first ? "" : ",") << "\n {\"rank\": " << r << ", \"dp_rank\": " << pm.dp_rank
        << ", \"tp_group\": " << format_list(pm.tp_mesh->ranks())
        << ", \"dp_group\": " << format_list(pm.dp_mesh->ranks());
    if (pm.ep_mesh)
      out << ", \"ep_mesh\": \"" << pm.ep_mesh->to_string()
          << "\", \"ep_group\": " << format_list(pm.ep_mesh->group_ranks(0))
          << ", \"expert_dp_group\": " << format_list(pm.expert_dp_mesh->ranks());
    if (pipelined)
      out << ", \"pp_rank\": " << pm.pp_rank
          << ", \"pp_group\": " << format_list(pm.pp_mesh->ranks()) << ", \"schedule\": \""
          << parallel::pipeline::to_string(schedule[pm.pp_rank]) << "\"";
    out << ", \"parameters\": [";
    bool pf = true;
    for (auto& [name, p] : pm.model->named_parameters()) {
      out << (pf ? "" : ",") << "\n  {\"name\": \"" << name
          << "\", \"global_shape\": " << format_list(p->shape)
          << ", \"local_shape\": " << format_list(p->data.sizes().vec()) << ", \"placements\": \""
          << dtensor::to_string(p->spec->placements()) << "\", \"mesh\": \""
          << p->spec->mesh().to_string() << "\"}";
      pf = false;
    }
    const auto e = train::estimate_memory(c, r, world_size);
    out << "],\n  \"memory_bytes\": {\"parameters\": " << json_bytes(e.parameters)
        << ", \"gradients\": " << json_bytes(e.gradients)
        << ", \"optimizer_state\": " << json_bytes(e.optimizer_state)
        << ", \"total\": " << json_bytes(e.total()) << "}, \"memory\": \""
        << train::format_bytes(e.total()) << "\"}";
    first = false;
  }
  out << "\n]}\n";
  std::cout << out.str();
}

// The backend this process runs on (comm/backend_choice.h): the launcher's decision (which
// read the same config), plain mpirun's or torchrun's, and the config's comm.backend.
std::string resolve_backend(const train::Config& cfg, const std::string& config_path) {
  comm::BackendRequest req;
  if (!cfg.comm.backend.empty()) {
    req.config = cfg.comm.backend;
    req.config_source = config_path;
  }
  const char* launcher = std::getenv("HYPERPAR_BACKEND");
  const char* flag = std::getenv("HYPERPAR_BACKEND_FLAG");
  if (launcher && *launcher) {
    // hyperpar-run decided already; a config it could not read may still disagree.
    req.started_by = std::string(launcher);
    req.started_by_name =
        flag && *flag ? "hyperpar-run --backend " + std::string(flag) : "hyperpar-run";
  } else if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
    req.started_by = std::string("mpi");
    req.started_by_name = "mpirun";
  } else if (std::getenv("TORCHELASTIC_RUN_ID") ||
             (std::getenv("RANK") && std::getenv("MASTER_ADDR") && std::getenv("MASTER_PORT"))) {
    req.started_by = std::string("gloo");
    req.started_by_name = "torchrun";
  }
  try {
    return comm::choose_backend(req);
  } catch (const comm::BackendConflict& e) {
    throw train::ConfigError(std::string("backend: ") + e.what());
  }
}

// The smallest world this layout trains on, for the "how to start it" hint.
int64_t smallest_world(train::Config c) {
  for (int64_t ws = 2; ws <= 4096; ++ws) {
    train::Config t = c;
    try {
      train::validate(t, ws);
      return ws;
    } catch (const train::ConfigError&) {
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory_for_reuse();
  comm::prepare_process_output();
  CLI::App app{"hyperpar-train: N-D parallel Transformer training"};
  std::string config_path, metrics, export_path, dump_first_batch, profile_path;
  std::vector<std::string> sets;
  bool dry = false, comm_report = false;
  int64_t world_size = -1, rank = -1;
  app.add_option("--config", config_path, "YAML config (see configs/)")->required();
  app.add_option("--set", sets, "override, e.g. --set train.steps=5 (repeatable)");
  app.add_option("--metrics", metrics, "write one JSON object per step here (rank 0)");
  app.add_option("--export", export_path,
                 "after training, write the full model (every parameter's full tensor) to this "
                 "safetensors file (rank 0 writes)");
  app.add_option("--dump-first-batch", dump_first_batch,
                 "write the first step's tokens, targets and logits here (DIR/rows-F.safetensors, "
                 "one file per data-parallel rank) for comparison with another implementation");
  app.add_flag("--comm-report", comm_report,
               "count every collective per module group and op (calls, bytes per step, against "
               "the layout's least); rank 0 prints every rank's table at the end and appends it "
               "to --metrics");
  app.add_option("--profile", profile_path,
                 "write a timeline of every step of every rank to this file (Chrome trace JSON, "
                 "for https://ui.perfetto.dev) and print how much communication was hidden");
  app.add_flag("--dry-run", dry, "print meshes, placements, shapes and memory; launch nothing");
  app.add_option("--world-size", world_size, "dry run: world size");
  app.add_option("--rank", rank, "dry run: only this rank");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  train::Config cfg;
  std::optional<data::DataLoader> data;
  const int64_t ws = dry ? (world_size > 0 ? world_size : 1) : launcher_world_size();
  try {
    cfg = train::load_config(config_path, sets);
    cfg.comm.backend = dry ? (cfg.comm.backend.empty() ? "mpi" : cfg.comm.backend)
                           : resolve_backend(cfg, config_path);
    try {
      train::validate(cfg, ws);
    } catch (const train::ConfigError& e) {
      const int64_t need = ws == 1 && !dry ? smallest_world(cfg) : -1;
      if (need < 0) throw;
      throw train::ConfigError(std::string(e.what()) +
                               "\nhyperpar-train was started as one "
                               "process, but this layout needs " +
                               std::to_string(need) +
                               " or more ranks; start it with: hyperpar-run --worker_num " +
                               std::to_string(need) + " " + argv[0] + " --config " + config_path);
    }
    if (dry && (rank < -1 || rank >= ws))
      throw train::ConfigError("--rank " + std::to_string(rank) + " is outside the world [0, " +
                               std::to_string(ws) + ")");
    if (dry) {
      dry_run(cfg, ws, rank);
      return 0;
    }
    {
      train::check_output_path("--metrics", metrics);
      train::check_output_path("--profile", profile_path);
      // From the dry-run estimator, before anything is allocated or communicated.
      train::check_memory_fits(train::estimate_memory(cfg, launcher_rank(), ws), launcher_rank(),
                               local_world_size());
      // Every rank opens and checks the same files: bad data stops all of them alike.
      const auto& t = cfg.train;
      data.emplace(cfg.data, t.seq_len, cfg.model.vocab_size, t.global_batch_size, t.seed,
                   t.eval_interval > 0 ? t.eval_batches : 0);
    }
  } catch (const UsageError& e) {
    std::cerr << "hyperpar-train: " << e.what() << "\n";
    comm::record_error("config", e.what());
    // Every rank finds the same error before any communication. A launcher stops the job at
    // the first non-zero exit, so give slower peers a moment to report theirs as well.
    if (!dry && ws > 1) std::this_thread::sleep_for(std::chrono::seconds(5));
    return 2;
  } catch (const c10::Error& e) {
    // Sizes no tensor can have (more than 2^63 bytes), found while building on meta.
    const std::string m = e.what_without_backtrace();
    std::cerr << "hyperpar-train: config " << config_path
              << ": the model cannot be built: " << m.substr(0, m.find('\n')) << "\n";
    return 2;
  }
  if (!std::getenv("HYPERPAR_BACKEND") && ws > 1)
    setenv("HYPERPAR_BACKEND", cfg.comm.backend.c_str(), 0);
  comm::set_collective_timeout(cfg.comm.init_timeout_s, "comm.init_timeout_s");
  return comm::run_main([&] {
    auto world = comm::World::from_env();
    HP_CHECK(world->size() == ws, "world size ", world->size(), " does not match ", ws);
    auto pm = train::build_parallel_model(cfg, world);
    if (world->rank() == 0)
      std::cout << "hyperpar-train: " << config_path << " on " << world->size() << " ranks ("
                << to_string(world->backend()) << "), mesh (" << (cfg.parallel.pp > 1 ? "pp, " : "")
                << "dp_replicate, dp_shard, tp) = ("
                << (cfg.parallel.pp > 1 ? std::to_string(cfg.parallel.pp) + ", " : "")
                << cfg.parallel.dp_replicate << ", " << cfg.parallel.dp_shard << ", "
                << cfg.parallel.tp << "), " << cfg.model.num_parameters()
                << " parameters, peak RSS " << train::peak_rss_mb() << " MiB after materialisation"
                << (cfg.parallel.pp > 1
                        ? "\nhyperpar-train: pipeline " + cfg.parallel.pp_schedule + ", " +
                              std::to_string(cfg.parallel.pp_microbatches) + " microbatches, " +
                              std::to_string(cfg.parallel.pp_virtual_stages) + " stage(s) per rank"
                        : std::string())
                << "\nhyperpar-train: data: " << data->describe() << std::endl;
    if (!cfg.init_from.empty()) {
      const std::string dir = cfg.init_from.substr(3);  // hf:DIR
      checkpoint::load_hf(dir, *pm.model, checkpoint::read_hf_config(dir), *world);
      if (world->rank() == 0)
        std::cout << "hyperpar-train: initialised from " << cfg.init_from << " ("
                  << checkpoint::hf_architecture(cfg.model) << ")" << std::endl;
    }
    train::TrainOptions opts;
    opts.metrics_path = metrics;
    opts.data = &*data;
    opts.dump_first_batch = dump_first_batch;
    opts.comm_report = comm_report;
    opts.profile_path = profile_path;
    train::run_training(cfg, pm, *world, opts);
    if (!export_path.empty()) {
      train::export_full_model(cfg, pm, export_path, *world);
      if (world->rank() == 0)
        std::cout << "hyperpar-train: exported the full model to " << export_path << std::endl;
    }
    return 0;
  });
}
