#include "hyperpar/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "hyperpar/core/error.h"

namespace hyperpar::data {

TokenFormat parse_token_format(const std::string& s, const std::string& key) {
  if (s == "auto") return TokenFormat::kAuto;
  if (s == "u16" || s == "uint16") return TokenFormat::kU16;
  if (s == "u32" || s == "uint32") return TokenFormat::kU32;
  if (s == "llmc" || s == "llm.c") return TokenFormat::kLlmc;
  throw UsageError(key + " must be auto, u16, u32 or llmc, got '" + s + "'");
}

const char* token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::kAuto:
      return "auto";
    case TokenFormat::kU16:
      return "u16";
    case TokenFormat::kU32:
      return "u32";
    case TokenFormat::kLlmc:
      return "llmc";
  }
  return "?";
}

TokenFile::TokenFile(const std::string& path, TokenFormat format) : path_(path), format_(format) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError("data: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError("data: " + path + " is not a regular file");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ > 0) {
    void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw UsageError("data: cannot map " + path + ": " + std::strerror(err));
    }
    map_ = static_cast<const unsigned char*>(m);
    // Windows are read in a random order: no read-ahead.
    ::madvise(m, map_size_, MADV_RANDOM);
  }
  ::close(fd);
  const auto bytes = static_cast<int64_t>(map_size_);
  int32_t header[3] = {0, 0, 0};
  if (bytes >= kLlmcHeaderBytes) std::memcpy(header, map_, sizeof(header));
  const bool llmc16 = header[0] == kLlmcMagicU16 && header[1] == kLlmcVersionU16;
  const bool llmc32 = header[0] == kLlmcMagicU32 && header[1] == kLlmcVersionU32;
  auto fail = [&](const std::string& why) {
    if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
    map_ = nullptr;
    throw UsageError("data: " + path + ": " + why);
  };
  if (format_ == TokenFormat::kAuto) {
    if (!llmc16 && !llmc32)
      fail(
          "data.format auto: the file has no llm.c header (magic 20240520 or 20240801); set "
          "data.format to u16 (nanoGPT's flat uint16 ids) or u32");
    format_ = TokenFormat::kLlmc;
  }
  if (format_ == TokenFormat::kLlmc) {
    if (!llmc16 && !llmc32)
      fail(
          "data.format llmc: no llm.c header (expected magic 20240520 version 1 or 20240801 "
          "version 7, got magic " +
          std::to_string(header[0]) + " version " + std::to_string(header[1]) + ")");
    width_ = llmc16 ? 2 : 4;
    data_offset_ = kLlmcHeaderBytes;
    n_tokens_ = header[2];
    const int64_t expected = kLlmcHeaderBytes + n_tokens_ * width_;
    if (n_tokens_ < 0 || expected != bytes)
      fail("the llm.c header says " + std::to_string(n_tokens_) + " tokens of " +
           std::to_string(width_) + " bytes (" + std::to_string(expected) +
           " bytes with the header), the file has " + std::to_string(bytes) +
           " bytes (truncated or not an llm.c file)");
    return;
  }
  width_ = format_ == TokenFormat::kU16 ? 2 : 4;
  if (bytes % width_)
    fail(std::to_string(bytes) + " bytes is not a whole number of " + std::to_string(width_) +
         "-byte tokens (data.format " + token_format_name(format_) + ")");
  n_tokens_ = bytes / width_;
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
}

void TokenFile::read(int64_t begin, int64_t n, int64_t* out) const {
  HP_CHECK(begin >= 0 && n >= 0 && begin + n <= n_tokens_, "data: ", path_, ": tokens [", begin,
           ", ", begin + n, ") outside the file's ", n_tokens_);
  const unsigned char* p = map_ + data_offset_ + begin * width_;
  if (width_ == 2) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    }
  }
}

std::pair<uint32_t, int64_t> TokenFile::max_in(int64_t begin, int64_t n) const {
  HP_CHECK(begin >= 0 && n >= 0 && begin + n <= n_tokens_, "data: ", path_, ": tokens [", begin,
           ", ", begin + n, ") outside the file's ", n_tokens_);
  const unsigned char* p = map_ + data_offset_ + begin * width_;
  uint32_t best = 0;
  int64_t at = begin;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    if (width_ == 2) {
      uint16_t s;
      std::memcpy(&s, p + 2 * i, 2);
      v = s;
    } else {
      std::memcpy(&v, p + 4 * i, 4);
    }
    if (v > best) {
      best = v;
      at = begin + i;
    }
  }
  return {best, at};
}

}  // namespace hyperpar::data

namespace hyperpar::data {

TokenFileWriter::TokenFileWriter(const std::string& path, TokenFormat format, bool wide)
    : path_(path), tmp_(path + ".tmp"), format_(format) {
  if (format_ == TokenFormat::kAuto)
    throw UsageError("token file " + path + ": a format to write must be u16, u32 or llmc");
  width_ = format_ == TokenFormat::kU32 || (format_ == TokenFormat::kLlmc && wide) ? 4 : 2;
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw UsageError("cannot write " + tmp_ + ": " + std::strerror(errno));
  if (format_ == TokenFormat::kLlmc) {
    const int32_t zeros[256] = {};
    std::fwrite(zeros, sizeof(zeros), 1, f_);
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void TokenFileWriter::append(const uint32_t* ids, size_t n) {
  HP_CHECK(f_, "TokenFileWriter: ", path_, " is finished");
  if (width_ == 4) {
    std::fwrite(ids, 4, n, f_);
  } else {
    std::vector<uint16_t> narrow(n);
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] > 0xffff)
        throw UsageError("token file " + path_ + ": id " + std::to_string(ids[i]) +
                         " does not fit uint16 (" + token_format_name(format_) +
                         "); write u32 (or llm.c's uint32 variant)");
      narrow[i] = static_cast<uint16_t>(ids[i]);
    }
    std::fwrite(narrow.data(), 2, n, f_);
  }
  n_ += static_cast<int64_t>(n);
}

void TokenFileWriter::finish() {
  HP_CHECK(f_, "TokenFileWriter: ", path_, " is finished");
  if (format_ == TokenFormat::kLlmc) {
    if (n_ > INT32_MAX)
      throw UsageError("token file " + path_ + ": llm.c's header counts at most 2^31 - 1 tokens");
    const int32_t header[3] = {
        width_ == 2 ? TokenFile::kLlmcMagicU16 : TokenFile::kLlmcMagicU32,
        width_ == 2 ? TokenFile::kLlmcVersionU16 : TokenFile::kLlmcVersionU32,
        static_cast<int32_t>(n_)};
    std::fseek(f_, 0, SEEK_SET);
    std::fwrite(header, sizeof(header), 1, f_);
  }
  const bool ok = std::fflush(f_) == 0 && !std::ferror(f_) && ::fsync(::fileno(f_)) == 0;
  std::fclose(f_);
  f_ = nullptr;
  if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    throw Error("writing " + path_ + " failed: " + std::strerror(errno));
  }
}

}  // namespace hyperpar::data
