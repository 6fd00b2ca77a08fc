// Meta build of a Transformer whose full fp32 weights take >= 4 GiB: built under
// DeviceContext(meta) (and tensor-parallelised there on a simulated TP=8 mesh) with less
// than 50 MiB of resident memory growth, and its parameter summary prints.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "hyperpar/core/device_context.h"
#include "hyperpar/core/process_memory.h"
#include "hyperpar/models/transformer.h"
#include "hyperpar/parallel/tensor_parallel.h"

using namespace hyperpar;

namespace {
int64_t rss_bytes() { return static_cast<int64_t>(resident_mb() * 1048576.0); }
models::TransformerConfig big() {
  models::TransformerConfig c;  // Llama-7B-like widths, 8 layers, MoE in two of them
  c.vocab_size = 32000;
  c.dim = 4096;
  c.n_layers = 8;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.ffn_hidden = 11008;
  c.n_experts = 8;
  c.top_k = 2;
  c.moe_layers = {3, 7};
  return c;
}
}  // namespace

TEST(MetaBuild, FourGiBModelUsesAlmostNoMemory) {
  const auto cfg = big();
  const int64_t bytes = cfg.num_parameters() * 4;
  ASSERT_GE(bytes, int64_t{4} << 30) << "the test model must be at least 4 GiB";
  at::empty({1}, at::kMeta);  // load ATen's meta kernels before measuring
  const int64_t before = rss_bytes();
  std::shared_ptr<models::Transformer> model;
  {
    DeviceContext meta(c10::kMeta);
    model = std::make_shared<models::Transformer>(cfg);
    auto mesh = mesh::DeviceMesh::init(comm::World::simulated(3, 8), {8}, {"tp"});
    parallel::parallelize_module(
        *model, mesh,
        parallel::transformer_tp_plan(cfg.n_heads, cfg.n_kv_heads, true, true, false, 8, false));
  }
  const std::string summary = model->summary();
  const int64_t grown = rss_bytes() - before;
  std::cout << "full weights " << bytes / double(1 << 30) << " GiB, RSS growth "
            << grown / double(1 << 20) << " MiB\n"
            << summary.substr(0, 600) << "...\n";
  EXPECT_LT(grown, int64_t{50} << 20);
  EXPECT_EQ(model->meta_parameter_names().size(), model->named_parameters().size());
  EXPECT_NE(summary.find("layers.3.moe.experts.w1  global [8, 11008, 4096]  local [8, 1376, 4096]"),
            std::string::npos);
  EXPECT_NE(summary.find("(Shard(0)) on DeviceMesh(tp=8"), std::string::npos);
  EXPECT_NE(summary.find("Float  meta"), std::string::npos);
}
