#pragma once
// Training samples cut from token files: window w of a file with n tokens is tokens
// [w * S, w * S + S + 1) (S = seq_len), for w < (n - 1) / S, so consecutive windows share one
// token (the last target of one is the first input of the next) and every token but the
// first is a target once per epoch. Windows never cross files. The windows of several files
// are numbered in file order; a TokenWindows is a contiguous range of those numbers (the
// training or the validation part of a split).
//
//   files of 100 and 40 tokens, S = 16: 6 + 2 windows; TokenWindows(files, 16, 6, 2) are
//   the second file's two windows, tokens [0, 17) and [16, 33) of it.
#include <memory>
#include <string>
#include <vector>

#include "hyperpar/data/token_file.h"

namespace hyperpar::data {

class TokenWindows {
 public:
  /// Windows [first, first + count) of `files` (count -1: all from `first` on).
  TokenWindows(std::vector<std::shared_ptr<const TokenFile>> files, int64_t seq_len,
               int64_t first = 0, int64_t count = -1);
  /// Windows of every file together, before any split.
  static int64_t count_windows(const std::vector<std::shared_ptr<const TokenFile>>& files,
                               int64_t seq_len);
  int64_t size() const { return count_; }
  int64_t seq_len() const { return seq_len_; }
  const std::vector<std::shared_ptr<const TokenFile>>& files() const { return files_; }
  /// Window i's S + 1 tokens into out.
  void read(int64_t i, int64_t* out) const;
  /// Throws UsageError naming the file and the token's offset if window i holds an id
  /// >= vocab.
  void check_vocab(int64_t i, int64_t vocab) const;
  /// Where window i starts: its file and the token index in that file.
  std::pair<const TokenFile*, int64_t> locate(int64_t i) const;

 private:
  std::vector<std::shared_ptr<const TokenFile>> files_;
  std::vector<int64_t> starts_;  // first global window number of each file
  int64_t seq_len_, first_, count_;
};

}  // namespace hyperpar::data
