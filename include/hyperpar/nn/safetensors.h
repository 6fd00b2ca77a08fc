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
#include <string>

#include "hyperpar/nn/module.h"

namespace hyperpar::nn {

void save_safetensors(Module& model, const std::string& path, bool write = true);
void load_safetensors(Module& model, const std::string& path);

}  // namespace hyperpar::nn
