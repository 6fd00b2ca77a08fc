// Peak memory of the deferred-init path on every rank: build a Transformer whose full fp32
// weights are >= 4 GiB under DeviceContext(meta), apply TP=2 and fully_shard (dp_shard = 4 on
// 8 ranks), then to_empty(cpu) + init_weights. Prints, per rank, the local shard bytes, the
// process's resident memory before building (the fixed overhead: LibTorch, MPI, allocator)
// and the peak resident memory (VmHWM) after materialisation, and checks
//   peak <= baseline + 1.1 x shard bytes.
// With --moe the last layer is an MoE of 8 experts (~10 GiB in all) under TP=2 + EP=2 +
// FSDP (experts on the ep mesh, expert FSDP over dp_shard*tp/ep = 4), the reported layout.
//
//   build/tools/hyperpar-run --worker_num 8 -- build/bench/bench_materialize [--moe] [--out F.json]
#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <numeric>

#include "hyperpar/comm/run_main.h"
#include "hyperpar/core/process_memory.h"
#include "hyperpar/train/parallel_model.h"
#include "hyperpar/train/trainer.h"
#include "large_model.h"

using namespace hyperpar;

int main(int argc, char** argv) {
  std::string out;
  bool moe = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--moe") moe = true;
    if (a == "--out" && i + 1 < argc) out = argv[++i];
  }
  return comm::run_main([&] {
    auto world = comm::World::from_env();
    train::Config c = bench::large_model_config(world->size());
    if (moe) {
      c.model.n_experts = 8;
      c.model.top_k = 2;
      c.model.moe_layers = {7};
      c.parallel.ep = world->size() % 4 == 0 ? 2 : 1;
    }
    train::validate(c, world->size());
    at::ones({4}).sum();  // load kernels before the baseline
    const double baseline = resident_mb();
    auto pm = train::build_parallel_model(c, world);
    const double peak = peak_resident_mb();
    const double shard = pm.model->local_parameter_bytes() / 1048576.0;
    std::vector<int64_t> all(world->size());
    std::iota(all.begin(), all.end(), 0);
    at::Tensor mine = at::tensor({shard, baseline, peak}, at::kDouble);
    at::Tensor every = at::empty({world->size() * 3}, at::kDouble);
    world->group(all, "world")->all_gather_into_tensor(every, mine);
    int bad = 0;
    if (world->rank() == 0) {
      const double full_gib = c.model.num_parameters() * 4.0 / (1 << 30);
      std::printf("model: %.2f GiB of fp32 weights, %d ranks, tp=%lld, ep=%lld, dp_shard=%lld\n",
                  full_gib, static_cast<int>(world->size()), static_cast<long long>(c.parallel.tp),
                  static_cast<long long>(c.parallel.ep),
                  static_cast<long long>(c.parallel.dp_shard));
      std::printf("rank  shard_MiB  baseline_MiB  peak_MiB  (peak-baseline)/shard\n");
      std::string json = "{\"full_weights_gib\": " + std::to_string(full_gib) + ", \"ranks\": [";
      for (int64_t r = 0; r < world->size(); ++r) {
        const double s = every[3 * r].item<double>(), b = every[3 * r + 1].item<double>(),
                     p = every[3 * r + 2].item<double>();
        const double ratio = (p - b) / s;
        bad += p > b + 1.1 * s;
        std::printf("%4lld  %9.1f  %12.1f  %8.1f  %.3f\n", static_cast<long long>(r), s, b, p,
                    ratio);
        json += (r ? ", " : "") + std::string("{\"rank\": ") + std::to_string(r) +
                ", \"shard_mib\": " + std::to_string(s) +
                ", \"baseline_mib\": " + std::to_string(b) +
                ", \"peak_mib\": " + std::to_string(p) + "}";
      }
      json += "]}\n";
      if (!out.empty()) std::ofstream(out) << json;
      std::printf(bad ? "FAIL: some rank exceeded baseline + 1.1 x shard\n"
                      : "ok: every rank within baseline + 1.1 x shard\n");
    }
    return bad ? 1 : 0;
  });
}
