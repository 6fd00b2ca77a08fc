#pragma once
// What a checkpoint directory holds: every *.safetensors file among `files` mapped, and for
// each tensor the boxes saved of it (DCP_SHARDING_INFO's saved_offsets and the stored
// shape; a file without sharding info holds whole tensors). The global shape of a tensor is
// where its boxes end, as PyTorch's HuggingFaceStorageReader infers it.
//
//   SavedIndex idx(dir, {"rank-00000-part-0.safetensors", ...});
//   for (const auto& c : idx.chunks().at("emb")) c.file->view("emb");  // one saved box
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyperpar/checkpoint/boxes.h"
#include "hyperpar/nn/safetensors.h"

namespace hyperpar::checkpoint {

struct SavedChunk {
  const nn::SafetensorsFile* file;
  Box box;  // offsets and sizes in the global tensor
};

class SavedIndex {
 public:
  /// Maps `files` (names in `dir`; non-.safetensors names are skipped).
  SavedIndex(const std::string& dir, const std::vector<std::string>& files);
  const std::map<std::string, std::vector<SavedChunk>>& chunks() const { return chunks_; }
  static std::vector<int64_t> global_shape(const std::vector<SavedChunk>& chunks);

 private:
  std::vector<std::unique_ptr<nn::SafetensorsFile>> files_;
  std::map<std::string, std::vector<SavedChunk>> chunks_;
};

}  // namespace hyperpar::checkpoint
