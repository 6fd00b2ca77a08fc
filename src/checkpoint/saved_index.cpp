#include "hyperpar/checkpoint/saved_index.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "hyperpar/core/error.h"

namespace hyperpar::checkpoint {

SavedIndex::SavedIndex(const std::string& dir, const std::vector<std::string>& files) {
  const std::string suffix = ".safetensors";
  for (const auto& name : files) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    files_.push_back(std::make_unique<nn::SafetensorsFile>(dir + "/" + name));
    const nn::SafetensorsFile& f = *files_.back();
    YAML::Node info;
    auto it = f.metadata().find("DCP_SHARDING_INFO");
    if (it != f.metadata().end()) info = YAML::Load(it->second);
    for (const auto& [fqn, e] : f.entries()) {
      Box b;
      b.sizes = e.shape;
      b.offsets.assign(e.shape.size(), 0);  // no sharding info: the whole tensor
      if (info && info[fqn]) b.offsets = info[fqn]["saved_offsets"].as<std::vector<int64_t>>();
      HP_CHECK(b.offsets.size() == b.sizes.size(), "checkpoint: ", f.path(), ": saved_offsets of ",
               fqn, " have ", b.offsets.size(), " dims, the tensor ", b.sizes.size());
      chunks_[fqn].push_back({&f, b});
    }
  }
}

std::vector<int64_t> SavedIndex::global_shape(const std::vector<SavedChunk>& cs) {
  std::vector<int64_t> shape(cs.front().box.sizes.size(), 0);
  for (const auto& c : cs)
    for (size_t d = 0; d < shape.size(); ++d)
      shape[d] = std::max(shape[d], c.box.offsets[d] + c.box.sizes[d]);
  return shape;
}

}  // namespace hyperpar::checkpoint
