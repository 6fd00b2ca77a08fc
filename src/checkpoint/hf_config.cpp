#include "hyperpar/checkpoint/hf_config.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"

namespace hyperpar::checkpoint {

std::string hf_architecture(const models::TransformerConfig& cfg) {
  if (cfg.n_experts == 0 || cfg.moe_layers.empty()) return "LlamaForCausalLM";
  if (cfg.shared_expert)
    throw UsageError(
        "no Hugging Face architecture matches this model: it has a shared expert, and "
        "transformers' MoE with one (Qwen2-MoE) gates it with a sigmoid shared_expert_gate "
        "that hyperpar's shared expert does not have; Mixtral has none");
  std::vector<int64_t> dense;
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    if (!cfg.is_moe_layer(l)) dense.push_back(l);
  if (!dense.empty())
    throw UsageError("no Hugging Face architecture matches this model: layers " +
                     format_list(dense) +
                     " are dense among MoE layers; Mixtral has MoE in every layer, and "
                     "transformers' architectures that mix dense and MoE layers (Qwen3-MoE's "
                     "mlp_only_layers) add per-head q/k norms that hyperpar does not have");
  return "MixtralForCausalLM";
}

std::string hf_config_json(const models::TransformerConfig& c, const std::string& dtype) {
  const std::string arch = hf_architecture(c);
  const bool moe = arch == "MixtralForCausalLM";
  char eps[64], theta[64];
  std::snprintf(eps, sizeof(eps), "%.17g", c.norm_eps);
  std::snprintf(theta, sizeof(theta), "%.17g", c.rope_theta);
  std::ostringstream os;
  os << "{\n  \"architectures\": [\"" << arch << "\"],\n  \"model_type\": \""
     << (moe ? "mixtral" : "llama") << "\",\n  \"vocab_size\": " << c.vocab_size
     << ",\n  \"hidden_size\": " << c.dim << ",\n  \"intermediate_size\": " << c.ffn_hidden
     << ",\n  \"num_hidden_layers\": " << c.n_layers
     << ",\n  \"num_attention_heads\": " << c.n_heads
     << ",\n  \"num_key_value_heads\": " << c.n_kv_heads
     << ",\n  \"head_dim\": " << c.dim / c.n_heads << ",\n  \"hidden_act\": \"silu\""
     << ",\n  \"rms_norm_eps\": " << eps << ",\n  \"rope_theta\": " << theta
     << ",\n  \"rope_scaling\": null,\n  \"attention_bias\": false,\n  \"attention_dropout\": 0.0"
     << ",\n  \"tie_word_embeddings\": false,\n  \"max_position_embeddings\": 4096"
     << ",\n  \"initializer_range\": 0.02,\n  \"use_cache\": true";
  if (moe)
    os << ",\n  \"num_local_experts\": " << c.n_experts
       << ",\n  \"num_experts_per_tok\": " << c.top_k
       << ",\n  \"sliding_window\": null,\n  \"router_jitter_noise\": 0.0"
       << ",\n  \"router_aux_loss_coef\": 0.0,\n  \"output_router_logits\": false";
  else
    os << ",\n  \"mlp_bias\": false,\n  \"pretraining_tp\": 1";
  os << ",\n  \"dtype\": \"" << dtype << "\",\n  \"torch_dtype\": \"" << dtype
     << "\",\n  \"exported_by\": \"hyperpar\"\n}\n";
  return os.str();
}

HFModelConfig read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!std::filesystem::exists(path))
    throw UsageError("model.init_from: " + dir + " has no config.json (expected a Hugging " +
                     "Face model directory, as save_pretrained writes it)");
  YAML::Node j;
  try {
    j = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    throw UsageError(path + ": not valid JSON: " + e.what());
  }
  auto fail = [&](const std::string& why) -> UsageError {
    return UsageError(path + ": " + why +
                      "; hyperpar imports Llama and Mixtral models only as "
                      "they are (see checkpoint/hf_config.h)");
  };
  auto get_int = [&](const char* key, int64_t fallback, bool required) {
    if (!j[key] || j[key].IsNull()) {
      if (required) throw fail(std::string("'") + key + "' is missing");
      return fallback;
    }
    return j[key].as<int64_t>();
  };
  const std::string type = j["model_type"] ? j["model_type"].as<std::string>() : "";
  if (type != "llama" && type != "mixtral")
    throw fail("model_type '" + type + "' is not llama or mixtral");
  HFModelConfig out;
  auto& m = out.model;
  m.vocab_size = get_int("vocab_size", 0, true);
  m.dim = get_int("hidden_size", 0, true);
  m.ffn_hidden = get_int("intermediate_size", 0, true);
  m.n_layers = get_int("num_hidden_layers", 0, true);
  m.n_heads = get_int("num_attention_heads", 0, true);
  m.n_kv_heads = get_int("num_key_value_heads", m.n_heads, false);
  if (m.n_heads <= 0 || m.dim % m.n_heads) throw fail("hidden_size is not a multiple of heads");
  const int64_t head_dim = get_int("head_dim", m.dim / m.n_heads, false);
  if (head_dim != m.dim / m.n_heads)
    throw fail("head_dim " + std::to_string(head_dim) + " differs from hidden_size / " +
               "num_attention_heads = " + std::to_string(m.dim / m.n_heads));
  if (j["rms_norm_eps"]) m.norm_eps = j["rms_norm_eps"].as<double>();
  // transformers 5 nests rope settings in rope_parameters; 4.x writes rope_theta and
  // rope_scaling at the top.
  const YAML::Node rp = j["rope_parameters"];
  if (rp && rp.IsMap()) {
    if (rp["rope_theta"]) m.rope_theta = rp["rope_theta"].as<double>();
    const std::string rt = rp["rope_type"] ? rp["rope_type"].as<std::string>() : "default";
    if (rt != "default") throw fail("rope_parameters.rope_type '" + rt + "' (scaled rope)");
  }
  if (j["rope_theta"] && !j["rope_theta"].IsNull()) m.rope_theta = j["rope_theta"].as<double>();
  if (j["rope_scaling"] && !j["rope_scaling"].IsNull()) {
    const YAML::Node rs = j["rope_scaling"];
    const std::string rt = rs["rope_type"] ? rs["rope_type"].as<std::string>()
                           : rs["type"]    ? rs["type"].as<std::string>()
                                           : "?";
    if (rt != "default") throw fail("rope_scaling '" + rt + "' (scaled rope)");
  }
  const std::string act = j["hidden_act"] ? j["hidden_act"].as<std::string>() : "silu";
  if (act != "silu") throw fail("hidden_act '" + act + "' is not silu (SwiGLU)");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j[key] && j[key].as<bool>()) throw fail(std::string(key) + " true (biases)");
  out.tie_word_embeddings = j["tie_word_embeddings"] && j["tie_word_embeddings"].as<bool>();
  if (type == "mixtral") {
    out.architecture = "MixtralForCausalLM";
    m.n_experts = get_int("num_local_experts", 0, true);
    m.top_k = get_int("num_experts_per_tok", 2, false);
    m.moe_layers.clear();
    for (int64_t l = 0; l < m.n_layers; ++l) m.moe_layers.push_back(l);
    m.shared_expert = false;
    if (j["sliding_window"] && !j["sliding_window"].IsNull())
      throw fail("sliding_window " + j["sliding_window"].as<std::string>() +
                 " (hyperpar's attention is full causal)");
    if (j["router_jitter_noise"] && j["router_jitter_noise"].as<double>() != 0)
      throw fail("router_jitter_noise is not 0");
  } else {
    out.architecture = "LlamaForCausalLM";
    m.n_experts = 0;
    m.moe_layers.clear();
  }
  try {
    m.validate();
  } catch (const Error& e) {
    throw fail(e.what());
  }
  return out;
}

}  // namespace hyperpar::checkpoint
