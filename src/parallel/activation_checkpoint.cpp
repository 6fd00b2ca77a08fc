#include "hyperpar/parallel/activation_checkpoint.h"

#include <cstdlib>

#include "hyperpar/core/error.h"

namespace hyperpar::parallel {

std::string ActivationCheckpoint::to_string() const {
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kFull:
      return "full";
    case Mode::kEvery:
      return "every:" + std::to_string(every);
    case Mode::kSelective:
      return "selective";
  }
  return "?";
}

ActivationCheckpoint parse_activation_checkpoint(const std::string& text, const std::string& key) {
  ActivationCheckpoint ac;
  if (text == "none") return ac;
  if (text == "full") {
    ac.mode = ActivationCheckpoint::Mode::kFull;
    return ac;
  }
  if (text == "selective") {
    ac.mode = ActivationCheckpoint::Mode::kSelective;
    return ac;
  }
  if (text.rfind("every:", 0) == 0) {
    const std::string k = text.substr(6);
    char* end = nullptr;
    const long long v = std::strtoll(k.c_str(), &end, 10);
    if (!k.empty() && end && *end == '\0' && v >= 1) {
      ac.mode = ActivationCheckpoint::Mode::kEvery;
      ac.every = v;
      return ac;
    }
  }
  throw UsageError(key + " must be none, full, every:K (K >= 1) or selective, got '" + text + "'");
}

void apply_activation_checkpoint(models::Transformer& model, const ActivationCheckpoint& ac) {
  using Mode = ActivationCheckpoint::Mode;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    auto& block = *model.layers[i];
    const int64_t id = model.layer_ids[i];
    switch (ac.mode) {
      case Mode::kNone:
        break;
      case Mode::kFull:
        block.set_checkpoint(nn::CheckpointMode::kWhole);
        break;
      case Mode::kEvery:
        if (id % ac.every == 0) block.set_checkpoint(nn::CheckpointMode::kWhole);
        break;
      case Mode::kSelective:
        block.attention->set_checkpoint(nn::CheckpointMode::kPointwise);
        if (block.feed_forward) block.feed_forward->set_checkpoint(nn::CheckpointMode::kPointwise);
        if (block.moe) {
          block.moe->experts->set_checkpoint(nn::CheckpointMode::kPointwise);
          if (block.moe->shared_expert)
            block.moe->shared_expert->set_checkpoint(nn::CheckpointMode::kPointwise);
        }
        break;
    }
  }
}

}  // namespace hyperpar::parallel
