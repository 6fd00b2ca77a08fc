#include "hyperpar/nn/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/dtensor.h"

namespace hyperpar::nn {
namespace {

const std::map<c10::ScalarType, std::string>& dtype_names() {
  static const std::map<c10::ScalarType, std::string> m = {
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"},
      {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"},     {at::kChar, "I8"},
      {at::kByte, "U8"},   {at::kBool, "BOOL"}};
  return m;
}

c10::ScalarType dtype_of(const std::string& name, const std::string& path) {
  for (const auto& [t, n] : dtype_names())
    if (n == name) return t;
  throw Error("safetensors " + path + ": unsupported dtype '" + name + "'");
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

void write_safetensors_file(const std::string& path,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata, bool sync) {
  std::ostringstream header;
  header << "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    header << (first ? "" : ",") << "\"" << json_escape(k) << "\":\"" << json_escape(v) << "\"";
    first = false;
  }
  header << "}";
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    HP_CHECK(t.is_contiguous() && !t.is_meta(), "safetensors ", path, ": tensor ", name,
             " must be materialised and contiguous");
    auto it = dtype_names().find(t.scalar_type());
    HP_CHECK(it != dtype_names().end(), "safetensors ", path, ": dtype ", t.scalar_type(), " of ",
             name, " has no safetensors name");
    header << ",\"" << json_escape(name) << "\":{\"dtype\":\"" << it->second << "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) header << (d ? "," : "") << t.size(d);
    const int64_t bytes = t.numel() * t.element_size();
    header << "],\"data_offsets\":[" << offset << "," << offset + bytes << "]}";
    offset += bytes;
  }
  header << "}";
  std::string h = header.str();
  while (h.size() % 8 != 0) h += ' ';  // data starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HP_CHECK(fd >= 0, "safetensors: cannot open ", tmp, " for writing: ", std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string err = std::strerror(errno);
        close(fd);
        throw Error("safetensors: writing " + tmp + " failed: " + err);
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  const uint64_t n = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  put(len, 8);
  put(h.data(), h.size());
  for (const auto& [name, t] : tensors) put(t.data_ptr(), t.numel() * t.element_size());
  if (sync && fsync(fd) != 0) {
    close(fd);
    throw Error("safetensors: fsync of " + tmp + " failed");
  }
  close(fd);
  HP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "safetensors: cannot rename ", tmp, " to ",
           path);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(MAP_FAILED) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK(fd >= 0, "safetensors: cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  HP_CHECK(size_ >= 8 && map_ != MAP_FAILED, "safetensors: ", path, " is too short or unreadable (",
           size_, " bytes)");
  const auto* bytes = static_cast<const unsigned char*>(map_);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  HP_CHECK(n <= size_ - 8, "safetensors: ", path, " header length ", n, " exceeds the file size ",
           size_);
  YAML::Node header;
  try {
    header = YAML::Load(std::string(reinterpret_cast<const char*>(bytes + 8), n));
  } catch (const std::exception& e) {
    throw Error("safetensors: " + path + ": malformed JSON header: " + e.what());
  }
  data_start_ = 8 + n;
  const size_t data_size = size_ - data_start_;
  for (const auto& kv : header) {
    const std::string key = kv.first.as<std::string>();
    if (key == "__metadata__") {
      for (const auto& m : kv.second)
        metadata_[m.first.as<std::string>()] = m.second.as<std::string>();
      continue;
    }
    Entry e;
    e.dtype = dtype_of(kv.second["dtype"].as<std::string>(), path);
    e.shape = kv.second["shape"].as<std::vector<int64_t>>();
    const auto off = kv.second["data_offsets"].as<std::vector<uint64_t>>();
    int64_t numel = 1;
    for (int64_t s : e.shape) numel *= s;
    HP_CHECK(off.size() == 2 && off[1] >= off[0] && off[1] <= data_size &&
                 off[1] - off[0] == static_cast<uint64_t>(numel) * c10::elementSize(e.dtype),
             "safetensors: ", key, " has inconsistent data_offsets in ", path);
    e.begin = off[0];
    e.end = off[1];
    entries_.emplace(key, e);
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != MAP_FAILED) munmap(map_, size_);
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  auto it = entries_.find(name);
  HP_CHECK(it != entries_.end(), "safetensors: ", path_, " has no tensor ", name);
  auto* base = static_cast<unsigned char*>(map_) + data_start_ + it->second.begin;
  return at::from_blob(base, it->second.shape, at::TensorOptions().dtype(it->second.dtype));
}

void SafetensorsFile::release(const std::string& name) const {
  auto it = entries_.find(name);
  if (it != entries_.end()) release(name, 0, it->second.end - it->second.begin);
}

void SafetensorsFile::release(const std::string& name, size_t begin, size_t end) const {
  auto it = entries_.find(name);
  if (it == entries_.end() || map_ == MAP_FAILED || end <= begin) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t lo = (data_start_ + it->second.begin + begin) / page * page;
  const size_t hi =
      data_start_ + it->second.begin + std::min(end, it->second.end - it->second.begin);
  if (hi > lo) madvise(static_cast<char*>(map_) + lo, hi - lo, MADV_DONTNEED);
}

void save_safetensors(Module& model, const std::string& path, bool write) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [fqn, p] : model.named_parameters()) {
    HP_CHECK(!p->data.is_meta(), "save_safetensors: parameter ", fqn, " is on meta");
    at::Tensor full =
        p->spec ? dtensor::DTensor(p->data.detach(), *p->spec).full_tensor() : p->data.detach();
    tensors.push_back({fqn, full.contiguous()});
  }
  if (!write) return;
  write_safetensors_file(path, tensors, {{"format", "pt"}, {"writer", "hyperpar"}}, false);
}

void load_safetensors(Module& model, const std::string& path) {
  const SafetensorsFile file(path);
  std::set<std::string> in_file;
  for (const auto& [key, e] : file.entries()) in_file.insert(key);
  std::vector<std::string> missing;
  auto params = model.named_parameters();
  for (auto& [fqn, p] : params)
    if (!in_file.erase(fqn)) missing.push_back(fqn);
  if (!missing.empty() || !in_file.empty()) {
    std::ostringstream os;
    os << "load_safetensors: " << path << " does not match the model;";
    if (!missing.empty()) {
      os << " missing:";
      for (const auto& m : missing) os << " " << m;
    }
    if (!in_file.empty()) {
      os << " unexpected:";
      for (const auto& m : in_file) os << " " << m;
    }
    throw Error(os.str());
  }
  at::NoGradGuard no_grad;
  for (auto& [fqn, p] : params) {
    const auto& shape = file.entries().at(fqn).shape;
    HP_CHECK(shape == p->shape, "load_safetensors: ", fqn, " has shape ", c10::IntArrayRef(shape),
             " in ", path, " but ", c10::IntArrayRef(p->shape), " in the model");
    HP_CHECK(!p->data.is_meta(), "load_safetensors: ", fqn, " is on meta; call to_empty first");
    p->data.copy_(dtensor::take_ranges(file.view(fqn), p->local_ranges()));
  }
}

}  // namespace hyperpar::nn
