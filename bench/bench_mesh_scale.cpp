// bench_mesh_scale: the cost of hyperpar's bookkeeping at scale, in one process on a
// simulated world (nothing is launched):
//   * DeviceMesh build of a (64, 64, 32) ("dp_replicate", "dp_shard", "tp") mesh over 131072
//     ranks, then a slice, a flatten and a concatenate, for one rank (median of 21 runs);
//   * the dry run of one rank of a 131072-rank TP x FSDP x EP layout (pp 4, dp_shard 1024,
//     tp 32, ep 8, 8-expert MoE): meshes, model on meta, TP, EP and fully_shard, what
//     hyperpar-train --dry-run --rank R does before printing (median of 5 runs).
// Prints both in milliseconds; with --out FILE also as JSON. Build type: Release.
//   build/bench/bench_mesh_scale [--out bench/results/mesh_scale.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "hyperpar/comm/world.h"
#include "hyperpar/mesh/device_mesh.h"
#include "hyperpar/train/parallel_model.h"

using namespace hyperpar;

namespace {

template <typename F>
double median_ms(int runs, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
  const int64_t world_size = 131072, rank = 77777;
  auto world = comm::World::simulated(rank, world_size);
  double build = 0, rest = 0;
  const double total = median_ms(21, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto m = mesh::DeviceMesh::init(world, {64, 64, 32}, {"dp_replicate", "dp_shard", "tp"});
    const auto t1 = std::chrono::steady_clock::now();
    auto dp = m.slice({"dp_replicate", "dp_shard"});
    auto flat = dp.flatten("dp");
    auto both = mesh::concatenate({flat, m["tp"]});
    if (both.size() != world_size) std::abort();
    const auto t2 = std::chrono::steady_clock::now();
    build = std::chrono::duration<double, std::milli>(t1 - t0).count();
    rest = std::chrono::duration<double, std::milli>(t2 - t1).count();
  });
  train::Config c;
  c.model.vocab_size = 32768;
  c.model.dim = 4096;
  c.model.n_layers = 32;
  c.model.n_heads = 32;
  c.model.n_kv_heads = 32;
  c.model.ffn_hidden = 14336;
  c.model.n_experts = 8;
  c.model.moe_layers = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  c.parallel.pp = 4;
  c.parallel.tp = 32;
  c.parallel.ep = 8;
  c.parallel.pp_microbatches = 8;
  c.parallel.pp_schedule = "1F1B";
  c.train.global_batch_size = 8192;
  c.train.seq_len = 4096;
  train::validate(c, world_size);
  const double dry = median_ms(5, [&] {
    auto pm = train::build_parallel_model(c, comm::World::simulated(rank, world_size), false);
    if (pm.model->named_parameters().empty()) std::abort();
  });
  std::printf(
      "mesh (64, 64, 32) over %lld ranks: build %.2f ms, slice+flatten+concatenate %.2f ms, "
      "total %.2f ms\n",
      static_cast<long long>(world_size), build, rest, total);
  std::printf("dry run of rank %lld, pp 4 x dp_shard %lld x tp 32 x ep 8: %.1f ms\n",
              static_cast<long long>(rank), static_cast<long long>(c.parallel.dp_shard), dry);
  if (!out.empty()) {
    std::ofstream f(out);
    f << "{\"world_size\": " << world_size << ", \"mesh_build_ms\": " << build
      << ", \"slice_flatten_concatenate_ms\": " << rest << ", \"mesh_total_ms\": " << total
      << ", \"dry_run_ms\": " << dry << "}\n";
  }
  return 0;
}
