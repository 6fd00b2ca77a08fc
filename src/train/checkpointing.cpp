#include "hyperpar/train/checkpointing.h"

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "hyperpar/checkpoint/checkpoint.h"
#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"

namespace hyperpar::train {

namespace {
constexpr const char* kVersion = "0.1.0";
std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
}  // namespace

TrainCheckpointer::TrainCheckpointer(const Config& c, ParallelModel& pm, optim::Optimizer& opt,
                                     comm::World& world, data::DataLoader& data)
    : c_(c), pm_(pm), opt_(opt), world_(world), data_(data) {}

std::string TrainCheckpointer::state_json(int64_t step) const {
  const auto& p = c_.parallel;
  std::ostringstream os;
  os << "{\"step\": " << step << ", \"optimizer_steps\": " << opt_.steps_taken()
     << ", \"optimizer\": \"" << c_.train.optimizer << "\", \"seed\": " << c_.train.seed
     << ", \"data\": " << data_.state_json(step) << ", \"world_size\": " << world_.size()
     << ", \"layout\": {\"dp_replicate\": " << p.dp_replicate << ", \"dp_shard\": " << p.dp_shard
     << ", \"tp\": " << p.tp << ", \"ep\": " << p.ep << ", \"expert_tp\": " << p.expert_tp << "}"
     << ", \"model\": {\"vocab_size\": " << c_.model.vocab_size << ", \"dim\": " << c_.model.dim
     << ", \"n_layers\": " << c_.model.n_layers << ", \"n_heads\": " << c_.model.n_heads
     << ", \"n_kv_heads\": " << c_.model.n_kv_heads << ", \"ffn_hidden\": " << c_.model.ffn_hidden
     << ", \"n_experts\": " << c_.model.n_experts << ", \"top_k\": " << c_.model.top_k
     << ", \"moe_layers\": " << format_list(c_.model.moe_layers)
     << ", \"shared_expert\": " << (c_.model.shared_expert ? "true" : "false")
     << ", \"norm_eps\": " << number(c_.model.norm_eps)
     << ", \"rope_theta\": " << number(c_.model.rope_theta) << "}"
     << ", \"train\": {\"steps\": " << c_.train.steps
     << ", \"global_batch_size\": " << c_.train.global_batch_size
     << ", \"micro_batches\": " << c_.train.micro_batches << ", \"seq_len\": " << c_.train.seq_len
     << ", \"lr\": " << c_.train.lr << ", \"warmup_steps\": " << c_.train.warmup_steps
     << ", \"weight_decay\": " << c_.train.weight_decay << ", \"grad_clip\": " << c_.train.grad_clip
     << "}, \"rng\": \"counter-based (Philox keyed by seed); no other random state\""
     << ", \"hyperpar_version\": \"" << kVersion << "\"}";
  return os.str();
}

int64_t TrainCheckpointer::resume() {
  const auto& k = c_.checkpoint;
  if (k.resume == "never") return 0;
  std::string path;
  if (k.resume == "auto") {
    if (k.dir.empty()) return 0;
    path = checkpoint::latest_complete(k.dir);
    if (path.empty()) return 0;
  } else {
    path = k.resume;
    if (!std::filesystem::is_directory(path))
      throw UsageError("checkpoint.resume: " + path + " is not a checkpoint directory");
  }
  auto shards = checkpoint::collect_shards(*pm_.model, &opt_, world_.rank());
  checkpoint::LoadOptions lo;
  lo.strict = k.strict;
  const auto r = checkpoint::load(path, shards, world_, lo);
  const YAML::Node st = r.state_json.empty() ? YAML::Node() : YAML::Load(r.state_json);
  // A foreign checkpoint (PyTorch's) has weights but no step: training starts at step 1.
  const int64_t step = st["step"] ? st["step"].as<int64_t>() : 0;
  opt_.set_steps_taken(st["optimizer_steps"] ? st["optimizer_steps"].as<int64_t>() : step);
  // The data position: samples consumed (older and foreign checkpoints: a full batch a step).
  const YAML::Node d = st["data"];
  const int64_t consumed = d && d["consumed_samples"] ? d["consumed_samples"].as<int64_t>()
                                                      : step * c_.train.global_batch_size;
  data_.resume_after(step, consumed);
  const int64_t windows = d && d["train_windows"] ? d["train_windows"].as<int64_t>() : -1;
  if (world_.rank() == 0 && windows >= 0 && windows != data_.train_windows())
    std::printf(
        "hyperpar-train: note: the checkpoint was saved with %lld training windows, the data "
        "now has %lld (changed data or seq_len); continuing after %lld samples\n",
        static_cast<long long>(windows), static_cast<long long>(data_.train_windows()),
        static_cast<long long>(consumed));
  if (world_.rank() == 0) {
    std::printf(
        "hyperpar-train: resumed from %s (step %lld, saved on %lld ranks); continuing at "
        "step %lld\n",
        path.c_str(), static_cast<long long>(step),
        static_cast<long long>(st["world_size"] ? st["world_size"].as<int64_t>() : 0),
        static_cast<long long>(step + 1));
    if (!r.missing_allowed.empty())
      std::printf(
          "hyperpar-train: checkpoint.strict false: %zu optimizer state tensors were not "
          "in the checkpoint and start from zero (first: %s)\n",
          r.missing_allowed.size(), r.missing_allowed.front().c_str());
    std::fflush(stdout);
  }
  return step;
}

std::string TrainCheckpointer::after_step(int64_t step, bool force) {
  const auto& k = c_.checkpoint;
  last_save_s_ = 0;
  const bool due = k.interval > 0 && step % k.interval == 0;
  if (k.dir.empty() || !(due || force)) return "";
  const auto start = std::chrono::steady_clock::now();
  auto shards = checkpoint::collect_shards(*pm_.model, &opt_, world_.rank());
  checkpoint::SaveOptions so;
  so.keep = k.keep;
  std::string path;
  if (k.async && !force) {
    async_.start(k.dir, step, shards, state_json(step), world_, so, comm::collective_timeout_s());
    path = k.dir + "/step-" + std::to_string(step);
  } else {
    async_.wait(world_);
    path = checkpoint::save(k.dir, step, shards, state_json(step), world_, so);
  }
  last_save_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return path;
}

std::string TrainCheckpointer::finish() { return async_.wait(world_); }

}  // namespace hyperpar::train
