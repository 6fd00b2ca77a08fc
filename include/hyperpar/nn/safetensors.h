#pragma once
// Model weights in the safetensors format (https://github.com/huggingface/safetensors):
// 8-byte little-endian header length N, N bytes of JSON
//   {"layers.0.attention.wq.weight": {"dtype": "F32", "shape": [64, 64],
//                                     "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
// then the raw little-endian tensor bytes, row-major. Names are the module's FQNs, so a
// model can be compared with (or loaded from) other frameworks.
//
// save: collective over every mesh a distributed parameter lives on (each is gathered with
// full_tensor); only ranks with `write` true write. The file is written to PATH.tmp and
// renamed, so an existing file is never left half-written.
// load: every rank maps the file and copies just its own block of each parameter (no
// communication). Names, shapes must match the model exactly (errors list the differences);
// dtypes are converted to the parameter's.
//
// The file primitives below are shared with checkpoint/ (one file per box set).
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hyperpar/nn/module.h"

namespace hyperpar::nn {

void save_safetensors(Module& model, const std::string& path, bool write = true);
void load_safetensors(Module& model, const std::string& path);

/// Writes contiguous tensors and string metadata to `path` (through PATH.tmp and a rename;
/// with `sync`, the file is fsync'ed before the rename).
void write_safetensors_file(const std::string& path,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata, bool sync);

/// A memory-mapped safetensors file: its header, metadata and zero-copy tensor views.
class SafetensorsFile {
 public:
  struct Entry {
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t begin, end;  // byte offsets in the data section
  };
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A CPU tensor viewing the mapped bytes of `name` (valid while this object lives).
  at::Tensor view(const std::string& name) const;
  /// Drops the mapped pages of `name` from this process's resident memory (they are read
  /// again from the page cache if viewed later), so reading a checkpoint box by box never
  /// holds more than one box's file pages.
  void release(const std::string& name) const;
  /// The same for bytes [begin, end) of `name`'s data.
  void release(const std::string& name, size_t begin, size_t end) const;

 private:
  std::string path_;
  void* map_;
  size_t size_ = 0, data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace hyperpar::nn
