#pragma once
// The batches of a training run: synthetic (data/synthetic.h) or cut from token files
// (data/token_windows.h), for training and for evaluation.
//
// Config section data (train/config.h):
//   data: {synthetic: true}                       the default: no files
//   data: {path: "corpus/*.bin", format: auto,    a file or a glob (sorted), token_file.h
//          val_path: "val.bin" | val_fraction: 0.05, shuffle_seed: 0 (default train.seed)}
//
// Order: the training windows are visited in the order of a seeded permutation per epoch
// (window_permutation.h; epoch e uses (shuffle_seed, e)). Sample g of the run (g = 0, 1, ...)
// is window perm_{g / N}(g mod N) of N training windows; the global batch of step s holds
// samples [c + (s - s0 - 1) B, c + (s - s0) B) where (s0, c) is the (step, consumed samples)
// resumed from (0, 0 for a fresh run) and B the global batch size. So a step's batch depends
// only on (data, seed, step), not on the layout: each data-parallel rank takes its rows.
// Before the rows of a step are handed out, every id of the step's whole global batch is
// checked against the vocabulary on every rank (the same check, so every rank fails alike
// and none waits in a collective for a rank that stopped).
//
// Validation: val_path's windows, or the last val_fraction of the windows of path (the
// training windows are then the rest). Evaluation batch i holds validation windows
// [i B, (i + 1) B) in file order, the same set whatever the layout and the step. With
// synthetic data the validation batches are a separate synthetic stream.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperpar/data/batch.h"
#include "hyperpar/data/token_windows.h"

namespace hyperpar::data {

struct DataConfig {
  bool synthetic = true;
  std::string path, val_path;
  std::string format = "auto";
  double val_fraction = 0;
  std::optional<uint64_t> shuffle_seed;  // default: train.seed
};

/// Files matching `pattern` (a path or a glob), sorted; throws UsageError when none does.
std::vector<std::string> expand_data_path(const std::string& pattern, const std::string& key);

class DataLoader {
 public:
  /// Opens the files and checks sizes (every evaluation batch must exist, and the eval
  /// windows' ids fit the vocabulary); throws UsageError (exit 2) on bad data.
  DataLoader(const DataConfig& dc, int64_t seq_len, int64_t vocab, int64_t global_batch,
             uint64_t seed, int64_t eval_batches);

  /// Rows [first, first + count) of the global batch of training step `step` (1-based).
  Batch train_rows(int64_t step, int64_t first, int64_t count);
  /// Rows [first, first + count) of evaluation batch `i` (0 <= i < eval_batches).
  Batch val_rows(int64_t i, int64_t first, int64_t count) const;
  bool has_validation() const { return synthetic_ || val_.has_value(); }

  struct Position {
    int64_t consumed_samples, epoch, index;
  };
  /// Where the data stands after `step`: samples consumed, and (epoch, index in the epoch)
  /// of the next sample.
  Position position_after(int64_t step) const;
  /// Continue after `step` with `consumed_samples` samples taken (from a checkpoint).
  void resume_after(int64_t step, int64_t consumed_samples);
  /// The "data" object of a checkpoint's state (JSON).
  std::string state_json(int64_t step) const;
  /// One line for the log: files, format, windows, split.
  std::string describe() const;
  int64_t train_windows() const { return train_ ? train_->size() : 0; }
  int64_t val_windows() const { return val_ ? val_->size() : 0; }

 private:
  Batch rows_of(const TokenWindows& w, const std::vector<int64_t>& windows) const;
  int64_t window_of_sample(int64_t g) const;
  bool synthetic_;
  int64_t seq_len_, vocab_, global_batch_;
  uint64_t seed_, shuffle_seed_;
  std::optional<TokenWindows> train_, val_;
  std::string format_name_;
  int64_t base_step_ = 0, base_samples_ = 0, checked_step_ = 0;
};

}  // namespace hyperpar::data
