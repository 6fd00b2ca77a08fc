#include "hyperpar/data/data_loader.h"

#include <ATen/ATen.h>
#include <glob.h>

#include <cmath>
#include <sstream>

#include "hyperpar/core/error.h"
#include "hyperpar/data/synthetic.h"
#include "hyperpar/data/window_permutation.h"

namespace hyperpar::data {

std::vector<std::string> expand_data_path(const std::string& pattern, const std::string& key) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty())
    throw UsageError(key + " '" + pattern + "' matches no file (a path or a glob like " +
                     "'data/train_*.bin')");
  return out;  // glob(3) sorts its matches
}

namespace {

std::vector<std::shared_ptr<const TokenFile>> open_all(const std::string& pattern,
                                                       const std::string& key, TokenFormat format) {
  std::vector<std::shared_ptr<const TokenFile>> files;
  for (const auto& p : expand_data_path(pattern, key))
    files.push_back(std::make_shared<const TokenFile>(p, format));
  return files;
}

std::string describe_files(const TokenWindows& w) {
  int64_t tokens = 0;
  for (const auto& f : w.files()) tokens += f->size();
  std::ostringstream os;
  os << w.files().size() << (w.files().size() == 1 ? " file" : " files") << " ("
     << w.files().front()->path() << (w.files().size() > 1 ? ", ..." : "") << "), " << tokens
     << " tokens";
  return os.str();
}

}  // namespace

DataLoader::DataLoader(const DataConfig& dc, int64_t seq_len, int64_t vocab, int64_t global_batch,
                       uint64_t seed, int64_t eval_batches)
    : synthetic_(dc.synthetic),
      seq_len_(seq_len),
      vocab_(vocab),
      global_batch_(global_batch),
      seed_(seed),
      shuffle_seed_(dc.shuffle_seed.value_or(seed)) {
  if (synthetic_) return;
  const TokenFormat format = parse_token_format(dc.format, "data.format");
  auto files = open_all(dc.path, "data.path", format);
  format_name_ = token_format_name(files.front()->format());
  const int64_t total = TokenWindows::count_windows(files, seq_len);
  auto too_small = [&](const std::string& what, int64_t have) {
    return UsageError("data: " + what + " has " + std::to_string(have) +
                      " windows of seq_len + 1 = " + std::to_string(seq_len + 1) +
                      " tokens; at least " + std::to_string(global_batch) +
                      " (train.global_batch_size) are needed");
  };
  if (!dc.val_path.empty()) {
    train_.emplace(files, seq_len);
    val_.emplace(open_all(dc.val_path, "data.val_path", format), seq_len);
  } else if (dc.val_fraction > 0) {
    const auto n_val =
        std::max<int64_t>(1, static_cast<int64_t>(std::llround(dc.val_fraction * total)));
    if (n_val >= total)
      throw UsageError("data.val_fraction " + std::to_string(dc.val_fraction) + " leaves no " +
                       "training windows (" + std::to_string(total) + " windows in all)");
    train_.emplace(files, seq_len, 0, total - n_val);
    val_.emplace(files, seq_len, total - n_val, n_val);
  } else {
    train_.emplace(files, seq_len);
  }
  if (train_->size() < global_batch) throw too_small("data.path " + dc.path, train_->size());
  if (eval_batches > 0) {
    if (!val_)
      throw UsageError(
          "train.eval_interval needs validation data: set data.val_path or data.val_fraction");
    if (val_->size() < eval_batches * global_batch)
      throw UsageError("data: the validation set has " + std::to_string(val_->size()) +
                       " windows; train.eval_batches " + std::to_string(eval_batches) +
                       " x train.global_batch_size " + std::to_string(global_batch) + " = " +
                       std::to_string(eval_batches * global_batch) +
                       " are needed (lower eval_batches or raise data.val_fraction)");
    for (int64_t i = 0; i < eval_batches * global_batch; ++i) val_->check_vocab(i, vocab);
  }
}

int64_t DataLoader::window_of_sample(int64_t g) const {
  const int64_t n = train_->size();
  return WindowPermutation(n, shuffle_seed_, g / n)(g % n);
}

Batch DataLoader::rows_of(const TokenWindows& w, const std::vector<int64_t>& windows) const {
  const auto count = static_cast<int64_t>(windows.size());
  at::Tensor all = at::empty({count, seq_len_ + 1}, at::TensorOptions().dtype(at::kLong));
  auto* out = all.data_ptr<int64_t>();
  for (int64_t r = 0; r < count; ++r) w.read(windows[r], out + r * (seq_len_ + 1));
  return {all.narrow(1, 0, seq_len_).contiguous(), all.narrow(1, 1, seq_len_).contiguous()};
}

Batch DataLoader::train_rows(int64_t step, int64_t first, int64_t count) {
  if (synthetic_) return make_batch(seed_, step, seq_len_, vocab_, first, count, 0);
  HP_CHECK(step > base_step_, "data: step ", step, " is before the resumed step ", base_step_);
  const int64_t begin = base_samples_ + (step - base_step_ - 1) * global_batch_;
  if (checked_step_ != step) {
    for (int64_t r = 0; r < global_batch_; ++r)
      train_->check_vocab(window_of_sample(begin + r), vocab_);
    checked_step_ = step;
  }
  std::vector<int64_t> windows;
  for (int64_t r = first; r < first + count; ++r) windows.push_back(window_of_sample(begin + r));
  return rows_of(*train_, windows);
}

Batch DataLoader::val_rows(int64_t i, int64_t first, int64_t count) const {
  if (synthetic_) return make_batch(seed_, i, seq_len_, vocab_, first, count, 1);
  HP_CHECK(val_, "data: no validation set");
  std::vector<int64_t> windows;
  for (int64_t r = first; r < first + count; ++r) windows.push_back(i * global_batch_ + r);
  return rows_of(*val_, windows);
}

DataLoader::Position DataLoader::position_after(int64_t step) const {
  const int64_t consumed = base_samples_ + (step - base_step_) * global_batch_;
  const int64_t n = synthetic_ ? 0 : train_->size();
  return {consumed, n ? consumed / n : 0, n ? consumed % n : consumed};
}

void DataLoader::resume_after(int64_t step, int64_t consumed_samples) {
  base_step_ = step;
  base_samples_ = consumed_samples;
  checked_step_ = 0;
}

std::string DataLoader::state_json(int64_t step) const {
  const Position p = position_after(step);
  std::ostringstream os;
  if (synthetic_) {
    os << "{\"kind\": \"synthetic\", \"next_step\": " << step + 1
       << ", \"consumed_samples\": " << p.consumed_samples << "}";
    return os.str();
  }
  os << "{\"kind\": \"tokens\", \"consumed_samples\": " << p.consumed_samples
     << ", \"epoch\": " << p.epoch << ", \"index\": " << p.index
     << ", \"train_windows\": " << train_->size() << ", \"seq_len\": " << seq_len_
     << ", \"shuffle_seed\": " << shuffle_seed_ << ", \"format\": \"" << format_name_ << "\"}";
  return os.str();
}

std::string DataLoader::describe() const {
  if (synthetic_) return "synthetic sequences (data.synthetic)";
  std::ostringstream os;
  os << "train " << describe_files(*train_) << ", " << train_->size() << " windows of "
     << seq_len_ + 1 << " tokens, format " << format_name_;
  if (val_)
    os << "; validation " << val_->size() << " windows"
       << (val_->files() == train_->files() ? " (split off the end)" : "");
  return os.str();
}

}  // namespace hyperpar::data
