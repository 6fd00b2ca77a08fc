#pragma once
// A memory-mapped file of token ids, never read whole.
//
// Formats:
//   u16   flat little-endian uint16 ids, no header (nanoGPT's train.bin / val.bin)
//   u32   flat little-endian uint32 ids, no header
//   llmc  llm.c's .bin: a header of 256 int32 (header[0] magic, header[1] version,
//         header[2] number of tokens), then the ids: magic 20240520 / version 1 -> uint16
//         (GPT-2), magic 20240801 / version 7 -> uint32 (Llama 3)
//   auto  llmc when the file starts with one of those headers; otherwise an error asking
//         for u16 or u32 (a headerless file does not say its width, and reading uint32 ids
//         as uint16 would silently train on garbage)
// A file's size must match its format exactly (header count, whole tokens).
//
//   TokenFile f("train.bin", TokenFormat::kAuto);   // llm.c file: f.format() == kLlmc
//   std::vector<int64_t> w(f.size() > 9 ? 9 : 0);
//   f.read(0, 9, w.data());                         // ids 0..8 widened to int64
#include <cstdint>
#include <cstdio>
#include <string>

namespace hyperpar::data {

enum class TokenFormat { kAuto, kU16, kU32, kLlmc };

/// "auto" | "u16" | "u32" | "llmc" (throws UsageError naming `key` otherwise).
TokenFormat parse_token_format(const std::string& s, const std::string& key);
const char* token_format_name(TokenFormat f);

class TokenFile {
 public:
  static constexpr int32_t kLlmcMagicU16 = 20240520, kLlmcVersionU16 = 1;
  static constexpr int32_t kLlmcMagicU32 = 20240801, kLlmcVersionU32 = 7;
  static constexpr int64_t kLlmcHeaderBytes = 256 * 4;

  TokenFile(const std::string& path, TokenFormat format);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }  // resolved (never kAuto)
  int64_t size() const { return n_tokens_; }      // tokens
  int bytes_per_token() const { return width_; }
  /// Byte offset of token `i` in the file (for error messages).
  int64_t byte_offset(int64_t i) const { return data_offset_ + i * width_; }
  /// Tokens [begin, begin + n) widened into out[0..n).
  void read(int64_t begin, int64_t n, int64_t* out) const;
  /// The largest id in [begin, begin + n) and the index of its first occurrence.
  std::pair<uint32_t, int64_t> max_in(int64_t begin, int64_t n) const;

 private:
  std::string path_;
  TokenFormat format_;
  int width_ = 2;
  int64_t n_tokens_ = 0, data_offset_ = 0;
  size_t map_size_ = 0;
  const unsigned char* map_ = nullptr;
};

/// Writes a token file of any resolved format, streaming: append() ids as they come, then
/// finish() (llm.c header filled in, fsync, PATH.tmp renamed to PATH). Destroyed without
/// finish(), it removes PATH.tmp and leaves no file. An id that does not fit the format's
/// width (>= 65536 in u16 / llmc-u16) throws. kLlmc writes llm.c's uint16 variant unless
/// `wide` (then magic 20240801, uint32).
///
///   TokenFileWriter w("train.bin", TokenFormat::kLlmc);
///   w.append(ids.data(), ids.size());
///   w.finish();   // w.tokens() ids written
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, TokenFormat format, bool wide = false);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  void append(const uint32_t* ids, size_t n);
  void finish();
  int64_t tokens() const { return n_; }

 private:
  std::string path_, tmp_;
  TokenFormat format_;
  int width_;
  std::FILE* f_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace hyperpar::data
