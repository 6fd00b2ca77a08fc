// Checkpoint save/load on every rank for the >= 4 GiB model of bench_materialize (TP=2 +
// FSDP on 8 ranks; parameters only, no optimizer state, to stay inside 24 GiB of RAM):
//   sync save      seconds and GB/s (written bytes of all ranks / the slowest rank's time)
//   async save     seconds the step is blocked (staging copies; the first save also allocates
//                  the staging buffers) and until the save completes
//   load           seconds, and the rank's peak resident memory during the load (VmHWM reset
//                  first), checked against the target  peak <= baseline + 1.1 x shard bytes
// Writes bench/results/checkpoint.json (or --out) on rank 0. A benchmark, not a test.
//
//   build/tools/hyperpar-run --worker_num 8 build/bench/bench_checkpoint [--dir D] [--out F]
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "hyperpar/checkpoint/async_saver.h"
#include "hyperpar/checkpoint/checkpoint.h"
#include "hyperpar/comm/run_main.h"
#include "hyperpar/core/process_memory.h"
#include "hyperpar/train/parallel_model.h"
#include "large_model.h"

using namespace hyperpar;
using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
}  // namespace

int main(int argc, char** argv) {
  std::string dir = "build/bench_checkpoint", out = "bench/results/checkpoint.json";
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[++i];
    if (a == "--out") out = argv[++i];
  }
  return comm::run_main([&] {
    auto world = comm::World::from_env();
    train::Config c = bench::large_model_config(world->size());
    train::validate(c, world->size());
    at::ones({4}).sum();
    const double baseline = resident_mb();
    auto pm = train::build_parallel_model(c, world);
    const double shard = pm.model->local_parameter_bytes() / 1048576.0;
    if (world->rank() == 0) std::filesystem::remove_all(dir);
    auto shards = checkpoint::collect_shards(*pm.model, nullptr, world->rank());
    std::vector<int64_t> all(world->size());
    std::iota(all.begin(), all.end(), 0);
    auto g = world->group(all, "world");
    g->barrier();

    auto t = Clock::now();
    checkpoint::save(dir, 1, shards, "{\"step\": 1}", *world);
    const double sync_s = since(t);

    // Two asynchronous saves: the first allocates the staging buffers, the second reuses
    // them (the cost every later checkpoint of a run pays).
    double async_first_block_s = 0, async_block_s = 0, async_total_s = 0;
    {
      checkpoint::AsyncSaver saver;
      g->barrier();
      t = Clock::now();
      saver.start(dir, 2, shards, "{\"step\": 2}", *world, {}, 600);
      async_first_block_s = since(t);
      saver.wait(*world);
      g->barrier();
      t = Clock::now();
      saver.start(dir, 3, shards, "{\"step\": 3}", *world, {}, 600);
      async_block_s = since(t);
      saver.wait(*world);
      async_total_s = since(t);
    }  // the staging buffers are freed before the load is measured

    // Load into the materialised model: what a resume costs, and its memory high-water mark.
    g->barrier();
    reset_peak_rss();
    t = Clock::now();
    checkpoint::load(dir + "/step-1", shards, *world);
    const double load_s = since(t);
    const double load_peak = peak_resident_mb();

    at::Tensor mine = at::tensor({shard, baseline, sync_s, async_block_s, async_total_s, load_s,
                                  async_first_block_s, load_peak},
                                 at::kDouble);
    at::Tensor every = at::empty({world->size() * 8}, at::kDouble);
    g->all_gather_into_tensor(every, mine);
    int bad = 0;
    if (world->rank() == 0) {
      double total_mib = 0, slowest_sync = 0, slowest_load = 0;
      std::printf(
          "rank  shard_MiB  sync_save_s  async_block_s (first)  async_total_s  load_s  "
          "baseline_MiB  load_peak_MiB  (peak-baseline)/shard\n");
      std::string json =
          "{\"model_gib\": " + std::to_string(c.model.num_parameters() * 4.0 / (1 << 30)) +
          ", \"ranks\": [";
      for (int64_t r = 0; r < world->size(); ++r) {
        const double* v = every.data_ptr<double>() + 8 * r;
        total_mib += v[0];
        slowest_sync = std::max(slowest_sync, v[2]);
        slowest_load = std::max(slowest_load, v[5]);
        const double ratio = (v[7] - v[1]) / v[0];
        bad += v[7] > v[1] + 1.1 * v[0];
        std::printf("%4lld  %9.1f  %11.2f  %13.3f (%5.2f)  %13.2f  %6.2f  %12.1f  %13.1f  %.3f\n",
                    static_cast<long long>(r), v[0], v[2], v[3], v[6], v[4], v[5], v[1], v[7],
                    ratio);
        json += (r ? ", " : "") + std::string("{\"rank\": ") + std::to_string(r) +
                ", \"shard_mib\": " + std::to_string(v[0]) +
                ", \"sync_save_s\": " + std::to_string(v[2]) +
                ", \"async_block_s\": " + std::to_string(v[3]) +
                ", \"async_first_block_s\": " + std::to_string(v[6]) +
                ", \"async_total_s\": " + std::to_string(v[4]) +
                ", \"load_s\": " + std::to_string(v[5]) +
                ", \"baseline_mib\": " + std::to_string(v[1]) +
                ", \"load_peak_mib\": " + std::to_string(v[7]) + "}";
      }
      std::printf(
          "all ranks: %.1f MiB written; sync save %.2f s (%.2f GB/s), load %.2f s "
          "(%.2f GB/s)\n",
          total_mib, slowest_sync, total_mib * 1.048576e-3 / slowest_sync, slowest_load,
          total_mib * 1.048576e-3 / slowest_load);
      json += "], \"sync_save_s\": " + std::to_string(slowest_sync) +
              ", \"load_s\": " + std::to_string(slowest_load) + "}\n";
      std::filesystem::create_directories(std::filesystem::path(out).parent_path());
      std::ofstream(out) << json;
      std::printf(bad ? "FAIL: some rank's load peak exceeded baseline + 1.1 x shard\n"
                      : "ok: every rank's load peak within baseline + 1.1 x shard\n");
      std::filesystem::remove_all(dir);
    }
    return bad ? 1 : 0;
  });
}
