#include "hyperpar/train/model_export.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hyperpar/core/device_context.h"
#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/nn/safetensors.h"

namespace hyperpar::train {

namespace {

std::vector<std::pair<std::string, at::Tensor>> full_tensors(nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [fqn, p] : m.named_parameters()) {
    HP_CHECK(!p->data.is_meta(), "--export: parameter ", fqn, " is on meta");
    at::Tensor full =
        p->spec ? dtensor::DTensor(p->data.detach(), *p->spec).full_tensor() : p->data.detach();
    out.emplace_back(fqn, full.contiguous());
  }
  return out;
}

// The names and shapes of the parameters pipeline rank `q` holds (its part, built on meta).
std::vector<std::pair<std::string, std::vector<int64_t>>> part_shapes(const Config& c,
                                                                      const ParallelModel& pm,
                                                                      int64_t q) {
  const int64_t pp = c.parallel.pp;
  models::ModelPart part;
  part.layers = parallel::pipeline::layers_of_rank(pm.stage_layers, q, pp);
  part.embedding = q == 0;
  part.head =
      parallel::pipeline::rank_of_stage(static_cast<int64_t>(pm.stage_layers.size()) - 1, pp) == q;
  DeviceContext meta(c10::kMeta);
  models::Transformer m(c.model, part);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (auto& [fqn, p] : m.named_parameters()) out.emplace_back(fqn, p->shape);
  return out;
}

}  // namespace

void export_full_model(const Config& c, ParallelModel& pm, const std::string& path,
                       comm::World& world) {
  auto tensors = full_tensors(*pm.model);
  if (c.parallel.pp == 1) {
    if (world.rank() == 0)
      nn::write_safetensors_file(path, tensors, {{"format", "pt"}, {"writer", "hyperpar"}}, false);
    return;
  }
  // Rank 0's pipeline: world ranks {0, S, 2S, ...}, the first rank of every stage.
  const std::vector<int64_t> pipeline = pm.pp_mesh->ranks();
  if (std::find(pipeline.begin(), pipeline.end(), int64_t{0}) == pipeline.end()) return;
  auto pp_group = pm.pp_mesh->get_group(0);
  if (pm.pp_rank != 0) {
    int64_t i = 0;
    for (auto& [fqn, t] : tensors) pp_group->send(t, 0, {"export " + fqn, false, i++});
    return;
  }
  for (int64_t q = 1; q < c.parallel.pp; ++q) {
    int64_t i = 0;
    for (auto& [fqn, shape] : part_shapes(c, pm, q)) {
      at::Tensor t = at::empty(shape, at::kFloat);
      pp_group->recv(t, q, {"export " + fqn, false, i++});
      tensors.emplace_back(fqn, t);
    }
  }
  // The whole model's order: embedding, layers by id, head.
  auto rank_of = [](const std::string& fqn) -> std::pair<int64_t, int64_t> {
    if (fqn.rfind("tok_embeddings", 0) == 0) return {0, 0};
    if (fqn.rfind("layers.", 0) == 0) return {1, std::stoll(fqn.substr(7))};
    return {2, 0};
  };
  std::stable_sort(tensors.begin(), tensors.end(), [&](const auto& a, const auto& b) {
    return rank_of(a.first) < rank_of(b.first);
  });
  nn::write_safetensors_file(path, tensors, {{"format", "pt"}, {"writer", "hyperpar"}}, false);
}

}  // namespace hyperpar::train
