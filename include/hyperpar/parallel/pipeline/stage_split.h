#pragma once
// Which layers each pipeline stage holds. The first stage also holds the token embedding,
// the last the final norm, the output projection and the loss; layer L keeps its name
// (layers.L.*) on whatever stage holds it, so init, checkpoints and HF export see one model.
//
// Default split: as even as possible, stage s gets layers [s n / S, (s + 1) n / S) for n
// layers over S stages (the larger stages come last, where the head is not):
//   split_layers(10, 4, {}) -> [0, 2) [2, 5) [5, 7) [7, 10)
// An explicit split lists the first layer of every stage (parallel.pp_split):
//   split_layers(10, 4, {0, 3, 6, 8}) -> [0, 3) [3, 6) [6, 8) [8, 10)
#include <cstdint>
#include <string>
#include <vector>

namespace hyperpar::parallel::pipeline {

struct StageLayers {
  int64_t first = 0, end = 0;  // layers [first, end)
  bool embedding = false;      // the first stage
  bool head = false;           // the last stage: norm, output, loss
  int64_t num_layers() const { return end - first; }
};

/// Throws UsageError naming `key` and the values when `first_layers` is not a valid split
/// (size, first entry 0, strictly increasing, every stage at least one layer).
std::vector<StageLayers> split_layers(int64_t n_layers, int64_t n_stages,
                                      const std::vector<int64_t>& first_layers,
                                      const std::string& key = "parallel.pp_split");

/// The layers of all stages on pipeline rank `rank` (stages rank, rank + pp, ...), ascending.
std::vector<int64_t> layers_of_rank(const std::vector<StageLayers>& stages, int64_t rank,
                                    int64_t pp);

}  // namespace hyperpar::parallel::pipeline
