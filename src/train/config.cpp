#include "hyperpar/train/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "hyperpar/checkpoint/hf_config.h"
#include "hyperpar/parallel/pipeline/stage_split.h"

namespace hyperpar::train {
namespace {

template <typename T>
T as(const YAML::Node& n, const std::string& key) {
  try {
    return n.as<T>();
  } catch (const std::exception&) {
    throw ConfigError("config: '" + key + "' has an invalid value '" + YAML::Dump(n) + "'");
  }
}

c10::ScalarType dtype_of(const std::string& s, const std::string& key) {
  if (s == "float32" || s == "fp32") return c10::kFloat;
  if (s == "bfloat16" || s == "bf16") return c10::kBFloat16;
  throw ConfigError("config: '" + key + "' must be float32 or bfloat16, got '" + s + "'");
}

using Setter = std::function<void(Config&, const YAML::Node&)>;

std::map<std::string, Setter> setters() {
  std::map<std::string, Setter> m;
#define HP_INT(sec, field, key) \
  m[key] = [](Config& c, const YAML::Node& n) { c.sec.field = as<int64_t>(n, key); }
#define HP_DBL(sec, field, key) \
  m[key] = [](Config& c, const YAML::Node& n) { c.sec.field = as<double>(n, key); }
#define HP_BOOL(sec, field, key) \
  m[key] = [](Config& c, const YAML::Node& n) { c.sec.field = as<bool>(n, key); }
  HP_INT(model, vocab_size, "model.vocab_size");
  HP_INT(model, dim, "model.dim");
  HP_INT(model, n_layers, "model.n_layers");
  HP_INT(model, n_heads, "model.n_heads");
  HP_INT(model, n_kv_heads, "model.n_kv_heads");
  HP_INT(model, ffn_hidden, "model.ffn_hidden");
  HP_DBL(model, norm_eps, "model.norm_eps");
  HP_DBL(model, rope_theta, "model.rope_theta");
  m["model.init_from"] = [](Config& c, const YAML::Node& n) {
    c.init_from = as<std::string>(n, "model.init_from");
  };
  HP_INT(model, n_experts, "model.moe.n_experts");
  HP_INT(model, top_k, "model.moe.top_k");
  HP_BOOL(model, shared_expert, "model.moe.shared_expert");
  m["model.moe.layers"] = [](Config& c, const YAML::Node& n) {
    c.model.moe_layers = as<std::vector<int64_t>>(n, "model.moe.layers");
  };
  HP_INT(parallel, tp, "parallel.tp");
  HP_INT(parallel, ep, "parallel.ep");
  HP_INT(parallel, expert_tp, "parallel.expert_tp");
  HP_INT(parallel, dp_replicate, "parallel.dp_replicate");
  m["parallel.expert_shard_dim"] = [](Config& c, const YAML::Node& n) {
    const std::string key = "parallel.expert_shard_dim";
    const std::string v = as<std::string>(n, key);
    if (v == "auto") {
      c.parallel.expert_shard_dim = -1;
      return;
    }
    if (v != "0" && v != "1")
      throw ConfigError("config: '" + key +
                        "' must be auto, 0 (experts) or 1 (the rows of "
                        "each expert), got " +
                        v);
    c.parallel.expert_shard_dim = v == "1" ? 1 : 0;
  };
  m["parallel.fsdp_collectives"] = [](Config& c, const YAML::Node& n) {
    const std::string key = "parallel.fsdp_collectives";
    const std::string v = as<std::string>(n, key);
    if (v == "per_group")
      c.parallel.fsdp_collectives = parallel::FSDPCollectives::kPerGroup;
    else if (v == "per_param")
      c.parallel.fsdp_collectives = parallel::FSDPCollectives::kPerParam;
    else
      throw ConfigError("config: '" + key + "' must be per_param or per_group, got " + v);
  };
  HP_INT(parallel, dp_shard, "parallel.dp_shard");
  HP_BOOL(parallel, init_on_meta, "parallel.init_on_meta");
  HP_BOOL(parallel, prefetch, "parallel.prefetch");
  HP_BOOL(parallel, fsdp_host_shared, "parallel.fsdp_host_shared");
  // true | always | false | k: reshard after forward to groups of k ranks (FSDP2's int form).
  m["parallel.reshard_after_forward"] = [](Config& c, const YAML::Node& n) {
    const std::string key = "parallel.reshard_after_forward";
    const std::string v = as<std::string>(n, key);
    c.parallel.reshard_root_and_last = v == "always";
    if (v == "true" || v == "false" || v == "always") {
      c.parallel.reshard_after_forward = v != "false";
      c.parallel.reshard_to = 0;
      return;
    }
    c.parallel.reshard_to = as<int64_t>(n, key);
    if (c.parallel.reshard_to < 1)
      throw ConfigError("config: '" + key +
                        "' must be true, always, false or a rank count >= 1, got " + v);
    c.parallel.reshard_after_forward = true;
  };
  HP_BOOL(parallel, sequence_parallel, "parallel.sequence_parallel");
  HP_BOOL(parallel, loss_parallel, "parallel.loss_parallel");
  HP_INT(parallel, pp, "parallel.pp");
  HP_INT(parallel, pp_microbatches, "parallel.pp_microbatches");
  HP_INT(parallel, pp_virtual_stages, "parallel.pp_virtual_stages");
  m["parallel.pp_schedule"] = [](Config& c, const YAML::Node& n) {
    c.parallel.pp_schedule = as<std::string>(n, "parallel.pp_schedule");
  };
  m["parallel.activation_checkpoint"] = [](Config& c, const YAML::Node& n) {
    const std::string key = "parallel.activation_checkpoint";
    try {
      c.parallel.activation_checkpoint =
          parallel::parse_activation_checkpoint(as<std::string>(n, key), key);
    } catch (const ConfigError&) {
      throw;
    } catch (const UsageError& e) {
      throw ConfigError(std::string("config: ") + e.what());
    }
  };
  m["parallel.pp_split"] = [](Config& c, const YAML::Node& n) {
    c.parallel.pp_split = as<std::vector<int64_t>>(n, "parallel.pp_split");
  };
  m["parallel.param_dtype"] = [](Config& c, const YAML::Node& n) {
    c.parallel.param_dtype =
        dtype_of(as<std::string>(n, "parallel.param_dtype"), "parallel.param_dtype");
  };
  m["parallel.reduce_dtype"] = [](Config& c, const YAML::Node& n) {
    c.parallel.reduce_dtype =
        dtype_of(as<std::string>(n, "parallel.reduce_dtype"), "parallel.reduce_dtype");
  };
  HP_INT(train, steps, "train.steps");
  HP_INT(train, global_batch_size, "train.global_batch_size");
  HP_INT(train, micro_batches, "train.micro_batches");
  HP_INT(train, seq_len, "train.seq_len");
  HP_INT(train, warmup_steps, "train.warmup_steps");
  HP_DBL(train, lr, "train.lr");
  HP_DBL(train, weight_decay, "train.weight_decay");
  HP_DBL(train, grad_clip, "train.grad_clip");
  m["train.seed"] = [](Config& c, const YAML::Node& n) {
    c.train.seed = as<uint64_t>(n, "train.seed");
  };
  m["train.optimizer"] = [](Config& c, const YAML::Node& n) {
    c.train.optimizer = as<std::string>(n, "train.optimizer");
  };
  HP_INT(train, eval_interval, "train.eval_interval");
  HP_INT(train, eval_batches, "train.eval_batches");
  HP_BOOL(data, synthetic, "data.synthetic");
  m["data.path"] = [](Config& c, const YAML::Node& n) {
    c.data.path = as<std::string>(n, "data.path");
  };
  m["data.val_path"] = [](Config& c, const YAML::Node& n) {
    c.data.val_path = as<std::string>(n, "data.val_path");
  };
  m["data.format"] = [](Config& c, const YAML::Node& n) {
    c.data.format = as<std::string>(n, "data.format");
  };
  HP_DBL(data, val_fraction, "data.val_fraction");
  m["data.shuffle_seed"] = [](Config& c, const YAML::Node& n) {
    c.data.shuffle_seed = as<uint64_t>(n, "data.shuffle_seed");
  };
  m["comm.backend"] = [](Config& c, const YAML::Node& n) {
    c.comm.backend = as<std::string>(n, "comm.backend");
  };
  HP_DBL(comm, init_timeout_s, "comm.init_timeout_s");
  m["checkpoint.dir"] = [](Config& c, const YAML::Node& n) {
    c.checkpoint.dir = as<std::string>(n, "checkpoint.dir");
  };
  HP_INT(checkpoint, interval, "checkpoint.interval");
  HP_INT(checkpoint, keep, "checkpoint.keep");
  HP_BOOL(checkpoint, async, "checkpoint.async");
  HP_BOOL(checkpoint, strict, "checkpoint.strict");
  m["checkpoint.resume"] = [](Config& c, const YAML::Node& n) {
    c.checkpoint.resume = as<std::string>(n, "checkpoint.resume");
  };
  HP_DBL(comm, train_timeout_s, "comm.train_timeout_s");
#undef HP_INT
#undef HP_DBL
#undef HP_BOOL
  return m;
}

void apply_node(Config& c, const YAML::Node& node, const std::string& prefix,
                const std::map<std::string, Setter>& s, const std::string& path) {
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = prefix + kv.first.as<std::string>();
    // yaml-cpp keeps both entries of a repeated key; YAML 1.2 says keys are unique.
    if (!seen.insert(key).second)
      throw ConfigError("config " + path + ": duplicate key '" + key + "' (line " +
                        std::to_string(kv.first.Mark().line + 1) + ")");
    auto it = s.find(key);
    if (it != s.end()) {
      it->second(c, kv.second);
      c.keys_given.emplace_back(key, YAML::Dump(kv.second));
      continue;
    }
    if (kv.second.IsMap()) {
      bool known_prefix = false;
      for (const auto& [k, f] : s) known_prefix |= k.rfind(key + ".", 0) == 0;
      if (known_prefix) {
        apply_node(c, kv.second, key + ".", s, path);
        continue;
      }
    }
    throw ConfigError("config: unknown key '" + key + "'");
  }
}

// model.init_from: hf:DIR replaces the model section by DIR/config.json; a model key the
// config also gives must agree with it.
void apply_init_from(Config& c) {
  const std::string prefix = "hf:";
  if (c.init_from.rfind(prefix, 0) != 0 || c.init_from.size() == prefix.size())
    throw ConfigError("config: model.init_from must be hf:DIR (a Hugging Face model directory), " +
                      std::string("got '") + c.init_from + "'");
  checkpoint::HFModelConfig hf;
  try {
    hf = checkpoint::read_hf_config(c.init_from.substr(prefix.size()));
  } catch (const UsageError& e) {
    throw ConfigError(e.what());
  }
  const auto s = setters();
  std::vector<std::string> conflicts;
  for (const auto& [key, value] : c.keys_given) {
    if (key.rfind("model.", 0) != 0 || key == "model.init_from") continue;
    Config probe;
    probe.model = hf.model;
    s.at(key)(probe, YAML::Load(value));
    if (probe.model.n_experts == 0) probe.model.moe_layers.clear();
    const auto& a = probe.model;
    const auto& b = hf.model;
    const bool same =
        a.vocab_size == b.vocab_size && a.dim == b.dim && a.n_layers == b.n_layers &&
        a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads && a.ffn_hidden == b.ffn_hidden &&
        a.norm_eps == b.norm_eps && a.rope_theta == b.rope_theta && a.n_experts == b.n_experts &&
        a.top_k == b.top_k && a.moe_layers == b.moe_layers && a.shared_expert == b.shared_expert;
    std::string v = value;
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    if (!same) conflicts.push_back(key + " = " + v);
  }
  if (!conflicts.empty()) {
    std::string msg = "config: model.init_from " + c.init_from +
                      " takes the model from its config.json, which disagrees with";
    for (const auto& k : conflicts) msg += " " + k + ";";
    throw ConfigError(msg + " remove those keys (or make them agree)");
  }
  c.model = hf.model;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    throw ConfigError("config: cannot read " + path + ": " + e.what());
  }
  if (root.IsNull())
    throw ConfigError("config " + path +
                      " is empty; expected a mapping with sections model, "
                      "parallel, train, comm (see configs/)");
  if (!root.IsMap())
    throw ConfigError("config " + path +
                      ": the top level must be a mapping (model: ..., "
                      "parallel: ..., train: ...), got a " +
                      (root.IsSequence() ? std::string("sequence") : std::string("scalar")));
  const auto s = setters();
  apply_node(c, root, "", s, path);
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos) throw ConfigError("--set '" + o + "': expected key=value");
    const std::string key = o.substr(0, eq);
    auto it = s.find(key);
    if (it == s.end()) throw ConfigError("--set: unknown key '" + key + "'");
    it->second(c, YAML::Load(o.substr(eq + 1)));
    c.keys_given.emplace_back(key, o.substr(eq + 1));
  }
  auto given = [&](const std::string& key) {
    for (const auto& [k, v] : c.keys_given)
      if (k == key) return true;
    return false;
  };
  if (!c.data.path.empty()) {
    if (given("data.synthetic") && c.data.synthetic)
      throw ConfigError("config: data.synthetic is true and data.path is set; choose one");
    c.data.synthetic = false;
  }
  if (!c.init_from.empty()) apply_init_from(c);
  // n_experts 0 is a dense model, whatever moe.layers lists.
  if (c.model.n_experts == 0) c.model.moe_layers.clear();
  return c;
}

parallel::pipeline::ScheduleSpec pipeline_spec(const Config& c) {
  const auto& p = c.parallel;
  return {parallel::pipeline::parse_schedule(p.pp_schedule, "parallel.pp_schedule"), p.pp,
          p.pp_virtual_stages, p.pp_microbatches};
}

void validate(Config& c, int64_t world) {
  auto& p = c.parallel;
  auto& t = c.train;
  auto fail = [](const std::string& m) { throw ConfigError("config: " + m); };
  try {
    c.model.validate();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    fail(e.what());
  }
  if (p.tp < 1 || p.ep < 1 || p.dp_replicate < 1 || p.pp < 1)
    fail("tp, ep, pp and dp_replicate must be >= 1");
  if (world % (p.pp * p.tp * p.dp_replicate) != 0)
    fail("world size " + std::to_string(world) + " is not divisible by pp*tp*dp_replicate = " +
         std::to_string(p.pp * p.tp * p.dp_replicate));
  const int64_t inferred = world / (p.pp * p.tp * p.dp_replicate);
  if (p.dp_shard == -1) p.dp_shard = inferred;
  if (p.dp_shard != inferred)
    fail("pp*dp_replicate*dp_shard*tp = " +
         std::to_string(p.pp * p.dp_replicate * p.dp_shard * p.tp) +
         " does not match the world size " + std::to_string(world));
  if (c.model.n_heads % p.tp || c.model.n_kv_heads % p.tp)
    fail("n_heads " + std::to_string(c.model.n_heads) + " and n_kv_heads " +
         std::to_string(c.model.n_kv_heads) + " must be divisible by tp " + std::to_string(p.tp));
  if (p.tp > 1 && c.model.vocab_size % p.tp) fail("vocab_size must be divisible by tp");
  const int64_t dp = p.dp_replicate * p.dp_shard;
  if (p.expert_tp != 1 && p.expert_tp != p.tp)
    fail("parallel.expert_tp must be 1 (ep borrows from dp_shard*tp) or tp (" +
         std::to_string(p.tp) + ": experts also split over tp), got " +
         std::to_string(p.expert_tp));
  if (p.ep > 1) {
    if (c.model.n_experts <= 0 || c.model.moe_layers.empty())
      fail("ep = " + std::to_string(p.ep) + " needs an MoE model (model.moe.n_experts > 0)");
    if (c.model.n_experts % p.ep)
      fail("n_experts " + std::to_string(c.model.n_experts) + " is not divisible by ep " +
           std::to_string(p.ep));
    if (p.expert_tp == 1 && (p.dp_shard * p.tp) % p.ep)
      fail("ep " + std::to_string(p.ep) + " must divide dp_shard*tp = " +
           std::to_string(p.dp_shard * p.tp) + " (ep borrows its ranks from them)");
    if (p.expert_tp > 1 && p.dp_shard % p.ep)
      fail("ep " + std::to_string(p.ep) + " must divide dp_shard = " + std::to_string(p.dp_shard) +
           " when parallel.expert_tp = tp");
  }
  if (p.reshard_to > 0 && p.dp_shard % p.reshard_to)
    fail("reshard_after_forward = " + std::to_string(p.reshard_to) +
         " must divide dp_shard = " + std::to_string(p.dp_shard));
  if (t.micro_batches < 1 || t.global_batch_size < 1)
    fail("train.micro_batches and train.global_batch_size must be >= 1");
  if (t.global_batch_size % (dp * t.micro_batches))
    fail("global_batch_size " + std::to_string(t.global_batch_size) + " must be divisible by dp (" +
         std::to_string(dp) + ") x micro_batches (" + std::to_string(t.micro_batches) + ")");
  if (p.pp_microbatches < 1 || p.pp_virtual_stages < 1)
    fail("parallel.pp_microbatches and parallel.pp_virtual_stages must be >= 1");
  if (p.pp == 1 && (p.pp_microbatches > 1 || p.pp_virtual_stages > 1 || !p.pp_split.empty()))
    fail("parallel.pp_microbatches, pp_virtual_stages and pp_split need parallel.pp > 1");
  if (p.pp > 1) {
    if (t.global_batch_size % (dp * t.micro_batches * p.pp_microbatches))
      fail("global_batch_size " + std::to_string(t.global_batch_size) +
           " must be divisible by dp (" + std::to_string(dp) + ") x micro_batches (" +
           std::to_string(t.micro_batches) + ") x pp_microbatches (" +
           std::to_string(p.pp_microbatches) + ")");
    try {
      const auto spec = pipeline_spec(c);
      parallel::pipeline::check_schedule(spec, c.model.n_layers);
      (void)parallel::pipeline::split_layers(c.model.n_layers, spec.stages(), p.pp_split);
    } catch (const UsageError& e) {
      fail(e.what());
    }
  }
  const int64_t micro_tokens =
      t.global_batch_size / (dp * t.micro_batches * p.pp_microbatches) * t.seq_len;
  if (p.ep > 1 && p.expert_tp == 1 && micro_tokens % p.tp)
    fail("with ep and expert_tp = 1 each tp rank dispatches an equal share of its tokens: the " +
         std::to_string(micro_tokens) + " tokens per micro-batch per dp rank must divide by tp " +
         std::to_string(p.tp));
  if (p.sequence_parallel && t.seq_len % p.tp)
    fail("seq_len must be divisible by tp for sequence_parallel");
  auto number = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  if (t.steps < 1) fail("train.steps must be >= 1, got " + std::to_string(t.steps));
  if (t.seq_len < 1) fail("train.seq_len must be >= 1, got " + std::to_string(t.seq_len));
  if (!std::isfinite(t.lr) || t.lr <= 0)
    fail("train.lr must be a finite number > 0, got " + number(t.lr));
  if (t.warmup_steps < 0)
    fail("train.warmup_steps must be >= 0, got " + std::to_string(t.warmup_steps));
  if (!std::isfinite(t.grad_clip) || t.grad_clip < 0)
    fail("train.grad_clip must be >= 0 (0: no clipping), got " + number(t.grad_clip));
  if (!std::isfinite(t.weight_decay) || t.weight_decay < 0)
    fail("train.weight_decay must be a finite number >= 0, got " + number(t.weight_decay));
  for (auto [key, v] :
       {std::pair<const char*, double>{"comm.init_timeout_s", c.comm.init_timeout_s},
        {"comm.train_timeout_s", c.comm.train_timeout_s}})
    if (!std::isfinite(v) || v <= 0)
      fail(std::string(key) + " must be a number of seconds > 0, got " + number(v));
  if (t.optimizer != "adamw" && t.optimizer != "sgd") fail("optimizer must be adamw or sgd");
  if (t.eval_interval < 0)
    fail("train.eval_interval must be >= 0 (0: no evaluation), got " +
         std::to_string(t.eval_interval));
  if (t.eval_interval > 0 && t.eval_batches < 1)
    fail("train.eval_batches must be >= 1, got " + std::to_string(t.eval_batches));
  const auto& d = c.data;
  if (!d.synthetic && d.path.empty()) fail("data.synthetic is false: set data.path");
  if (d.synthetic && (!d.val_path.empty() || d.val_fraction != 0))
    fail(
        "data.val_path and data.val_fraction need data.path (synthetic data has its own "
        "validation stream)");
  if (!std::isfinite(d.val_fraction) || d.val_fraction < 0 || d.val_fraction >= 1)
    fail("data.val_fraction must be in [0, 1), got " + number(d.val_fraction));
  if (!d.val_path.empty() && d.val_fraction > 0)
    fail("data.val_path and data.val_fraction are both set; choose one");
  try {
    (void)data::parse_token_format(d.format, "data.format");
  } catch (const UsageError& e) {
    fail(e.what());
  }
  if (!std::isfinite(c.model.norm_eps) || c.model.norm_eps <= 0)
    fail("model.norm_eps must be > 0, got " + number(c.model.norm_eps));
  if (!std::isfinite(c.model.rope_theta) || c.model.rope_theta <= 0)
    fail("model.rope_theta must be > 0, got " + number(c.model.rope_theta));
  const auto& k = c.checkpoint;
  if (k.interval < 0) fail("checkpoint.interval must be >= 0, got " + std::to_string(k.interval));
  if (k.keep < 0) fail("checkpoint.keep must be >= 0 (0: keep all), got " + std::to_string(k.keep));
  if (k.interval > 0 && k.dir.empty()) fail("checkpoint.interval needs checkpoint.dir");
  if (k.resume.empty()) fail("checkpoint.resume must be auto, never or a checkpoint path");
  if (!c.comm.backend.empty() && c.comm.backend != "mpi" && c.comm.backend != "gloo")
    fail("comm.backend must be mpi or gloo, got '" + c.comm.backend + "'");
  if (c.comm.backend != "gloo" && p.reduce_dtype != c10::kFloat)
    fail("the MPI backend reduces float32 only: set parallel.reduce_dtype=float32");
}

}  // namespace hyperpar::train
