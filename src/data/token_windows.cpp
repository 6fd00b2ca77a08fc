#include "hyperpar/data/token_windows.h"

#include <algorithm>

#include "hyperpar/core/error.h"

namespace hyperpar::data {

namespace {
int64_t windows_of(const TokenFile& f, int64_t seq_len) {
  return f.size() > 1 ? (f.size() - 1) / seq_len : 0;
}
}  // namespace

int64_t TokenWindows::count_windows(const std::vector<std::shared_ptr<const TokenFile>>& files,
                                    int64_t seq_len) {
  int64_t n = 0;
  for (const auto& f : files) n += windows_of(*f, seq_len);
  return n;
}

TokenWindows::TokenWindows(std::vector<std::shared_ptr<const TokenFile>> files, int64_t seq_len,
                           int64_t first, int64_t count)
    : files_(std::move(files)), seq_len_(seq_len), first_(first) {
  HP_CHECK(seq_len > 0, "TokenWindows: seq_len must be positive");
  int64_t total = 0;
  for (const auto& f : files_) {
    starts_.push_back(total);
    total += windows_of(*f, seq_len);
  }
  count_ = count < 0 ? total - first : count;
  HP_CHECK(first >= 0 && count_ >= 0 && first + count_ <= total, "TokenWindows: windows [", first,
           ", ", first + count_, ") outside the ", total, " windows of the files");
}

std::pair<const TokenFile*, int64_t> TokenWindows::locate(int64_t i) const {
  HP_CHECK(i >= 0 && i < count_, "TokenWindows: window ", i, " outside [0, ", count_, ")");
  const int64_t g = first_ + i;
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), g) - 1;
  const auto f = static_cast<size_t>(it - starts_.begin());
  return {files_[f].get(), (g - *it) * seq_len_};
}

void TokenWindows::read(int64_t i, int64_t* out) const {
  const auto [file, start] = locate(i);
  file->read(start, seq_len_ + 1, out);
}

void TokenWindows::check_vocab(int64_t i, int64_t vocab) const {
  const auto [file, start] = locate(i);
  const auto [max, at] = file->max_in(start, seq_len_ + 1);
  if (static_cast<int64_t>(max) >= vocab)
    throw UsageError("data: " + file->path() + ": token id " + std::to_string(max) +
                     " at token offset " + std::to_string(at) + " (byte offset " +
                     std::to_string(file->byte_offset(at)) + ") is >= model.vocab_size " +
                     std::to_string(vocab) +
                     "; the data was tokenized for a larger vocabulary (set model.vocab_size "
                     "to at least " +
                     std::to_string(max + 1) + ")");
}

}  // namespace hyperpar::data
