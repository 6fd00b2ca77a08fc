#include "hyperpar/checkpoint/hf_export.h"

#include <ATen/ATen.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "hyperpar/checkpoint/hf_config.h"
#include "hyperpar/checkpoint/hf_names.h"
#include "hyperpar/checkpoint/manifest.h"
#include "hyperpar/checkpoint/saved_index.h"
#include "hyperpar/core/error.h"
#include "hyperpar/nn/safetensors.h"

namespace hyperpar::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The whole tensor `fqn` from its saved boxes.
at::Tensor assemble(const std::vector<SavedChunk>& chunks, const std::string& fqn) {
  const auto shape = SavedIndex::global_shape(chunks);
  const auto dtype = chunks.front().file->entries().at(fqn).dtype;
  at::Tensor full = at::empty(shape, at::TensorOptions().dtype(dtype));
  int64_t covered = 0;
  for (const auto& c : chunks) {
    at::Tensor dst = full;
    for (size_t d = 0; d < c.box.sizes.size(); ++d)
      dst = dst.narrow(static_cast<int64_t>(d), c.box.offsets[d], c.box.sizes[d]);
    dst.copy_(c.file->view(fqn));
    c.file->release(fqn);
    covered += c.box.numel();
  }
  HP_CHECK(covered == full.numel(), "checkpoint: the saved boxes of ", fqn, " cover ", covered,
           " of its ", full.numel(), " elements");
  return full;
}

}  // namespace

models::TransformerConfig checkpoint_model_config(const std::string& dir) {
  const std::string text = read_text(dir + "/hyperpar_state.json");
  if (text.empty())
    throw UsageError(dir + " has no hyperpar_state.json (not a hyperpar checkpoint): the " +
                     "model config cannot be known");
  const YAML::Node st = YAML::Load(text);
  const YAML::Node m = st["model"];
  if (!m) throw UsageError(dir + "/hyperpar_state.json has no model section");
  models::TransformerConfig c;
  c.vocab_size = m["vocab_size"].as<int64_t>();
  c.dim = m["dim"].as<int64_t>();
  c.n_layers = m["n_layers"].as<int64_t>();
  c.n_heads = m["n_heads"].as<int64_t>();
  c.n_kv_heads = m["n_kv_heads"].as<int64_t>();
  c.ffn_hidden = m["ffn_hidden"].as<int64_t>();
  c.n_experts = m["n_experts"] ? m["n_experts"].as<int64_t>() : 0;
  c.top_k = m["top_k"] ? m["top_k"].as<int64_t>() : 2;
  if (m["norm_eps"]) c.norm_eps = m["norm_eps"].as<double>();
  if (m["rope_theta"]) c.rope_theta = m["rope_theta"].as<double>();
  if (m["moe_layers"]) {
    c.moe_layers = m["moe_layers"].as<std::vector<int64_t>>();
    c.shared_expert = m["shared_expert"] && m["shared_expert"].as<bool>();
  } else if (c.n_experts > 0) {
    // Checkpoints from before the state listed them: the tensor names say.
    const auto manifest = read_manifest(dir + "/manifest.json");
    std::vector<std::string> names;
    for (const auto& [n, d] : manifest) names.push_back(n);
    const SavedIndex index(dir, names);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".moe.";
      if (index.chunks().count(p + "router.weight")) c.moe_layers.push_back(l);
      if (index.chunks().count(p + "shared_expert.w1.weight")) c.shared_expert = true;
    }
  }
  c.validate();
  return c;
}

HFExportResult export_hf(const std::string& dir, const std::string& out, const HFExportOptions& o) {
  if (!fs::exists(dir + "/manifest.json"))
    throw UsageError(dir + " is not a complete hyperpar checkpoint (no manifest.json)");
  const auto manifest = read_manifest(dir + "/manifest.json");
  const auto problems = verify(dir, manifest);
  if (!problems.empty()) {
    std::string msg = "checkpoint " + dir + " failed verification, nothing exported:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw UsageError(msg);
  }
  if (o.dtype != "float32" && o.dtype != "bfloat16")
    throw UsageError("--dtype must be float32 or bfloat16, got " + o.dtype);
  if (o.max_shard_bytes <= 0) throw UsageError("--max_shard_size must be positive");
  const models::TransformerConfig cfg = checkpoint_model_config(dir);
  HFExportResult r;
  r.architecture = hf_architecture(cfg);  // refuses models no HF architecture matches
  std::error_code ec;
  if (fs::exists(out) && !fs::is_empty(out, ec)) {
    const std::string prev = read_text(out + "/config.json");
    if (!o.overwrite || prev.find("\"exported_by\": \"hyperpar\"") == std::string::npos)
      throw UsageError("output directory " + out +
                       " is not empty; choose a new one (--overwrite replaces an earlier "
                       "hyperpar export there, and nothing else)");
    for (const auto& e : fs::directory_iterator(out)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("model", 0) == 0 &&
          (e.path().extension() == ".safetensors" || n == "model.safetensors.index.json"))
        fs::remove(e.path());
    }
  }
  fs::create_directories(out);
  std::vector<std::string> names;
  for (const auto& [n, d] : manifest) names.push_back(n);
  const SavedIndex index(dir, names);
  const auto& chunks = index.chunks();
  const auto dtype = o.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  // The parameters (the optimizer state stays behind), by name.
  std::vector<std::string> fqns;
  for (const auto& [fqn, c] : chunks)
    if (fqn.rfind("optimizer.", 0) != 0) fqns.push_back(fqn);
  // Plan the shards by size (known from the saved shapes), then write them one at a time.
  const int64_t elem = dtype == at::kBFloat16 ? 2 : 4;
  std::vector<std::vector<std::string>> shards(1);
  int64_t in_shard = 0;
  for (const auto& fqn : fqns) {
    int64_t numel = 1;
    for (int64_t s : SavedIndex::global_shape(chunks.at(fqn))) numel *= s;
    const int64_t bytes = numel * elem;
    if (in_shard > 0 && in_shard + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(fqn);
    in_shard += bytes;
    r.bytes += bytes;
  }
  const size_t n = shards.size();
  std::ostringstream index_json;
  index_json << "{\n  \"metadata\": {\"total_size\": " << r.bytes << "},\n  \"weight_map\": {";
  bool first_entry = true;
  for (size_t s = 0; s < n; ++s) {
    char name[64];
    if (n == 1)
      std::snprintf(name, sizeof(name), "model.safetensors");
    else
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, n);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& fqn : shards[s]) {
      const HFTensorRef ref = hf_tensor_of(fqn, cfg);
      at::Tensor full = assemble(chunks.at(fqn), fqn).to(dtype);
      if (ref.kind == HFTensorRef::kRotaryRows) {
        tensors.emplace_back(ref.name, rotary_rows_to_hf(full, ref.head_dim).contiguous());
      } else if (ref.kind == HFTensorRef::kExperts) {
        for (int64_t e = 0; e < full.size(0); ++e)
          tensors.emplace_back(ref.expert(e), full[e].contiguous());
      } else {
        tensors.emplace_back(ref.name, full.contiguous());
      }
    }
    for (const auto& [hf_name, t] : tensors) {
      index_json << (first_entry ? "\n" : ",\n") << "    \"" << hf_name << "\": \"" << name << "\"";
      first_entry = false;
    }
    r.tensors += static_cast<int64_t>(tensors.size());
    nn::write_safetensors_file(out + "/" + name, tensors, {{"format", "pt"}}, true);
    r.files.push_back(name);
  }
  index_json << "\n  }\n}\n";
  if (n > 1) {
    std::ofstream f(out + "/model.safetensors.index.json");
    f << index_json.str();
    HP_CHECK(f.good(), "writing ", out, "/model.safetensors.index.json failed");
  }
  std::ofstream f(out + "/config.json");
  f << hf_config_json(cfg, o.dtype);
  HP_CHECK(f.good(), "writing ", out, "/config.json failed");
  return r;
}

}  // namespace hyperpar::checkpoint
