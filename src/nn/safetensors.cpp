#include "hyperpar/nn/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

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

struct Mapped {
  void* data = MAP_FAILED;
  size_t size = 0;
  ~Mapped() {
    if (data != MAP_FAILED) munmap(data, size);
  }
};

}  // namespace

void save_safetensors(Module& model, const std::string& path, bool write) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [fqn, p] : model.named_parameters()) {
    HP_CHECK(!p->data.is_meta(), "save_safetensors: parameter ", fqn, " is on meta");
    at::Tensor full =
        p->spec ? dtensor::DTensor(p->data.detach(), *p->spec).full_tensor() : p->data.detach();
    tensors.push_back({fqn, full.contiguous()});
  }
  if (!write) return;
  std::ostringstream header;
  header << "{\"__metadata__\":{\"format\":\"pt\",\"writer\":\"hyperpar\"}";
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    auto it = dtype_names().find(t.scalar_type());
    HP_CHECK(it != dtype_names().end(), "save_safetensors: dtype ", t.scalar_type(), " of ", name,
             " has no safetensors name");
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
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    HP_CHECK(out.good(), "save_safetensors: cannot open ", tmp, " for writing");
    const uint64_t n = h.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, t] : tensors)
      out.write(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
    out.flush();
    HP_CHECK(out.good(), "save_safetensors: writing ", tmp, " failed (disk full?)");
  }
  HP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors: cannot rename ", tmp,
           " to ", path);
}

void load_safetensors(Module& model, const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  HP_CHECK(fd >= 0, "load_safetensors: cannot open ", path);
  struct stat st {};
  fstat(fd, &st);
  Mapped map;
  map.size = static_cast<size_t>(st.st_size);
  if (map.size > 0) map.data = mmap(nullptr, map.size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  HP_CHECK(map.size >= 8 && map.data != MAP_FAILED, "load_safetensors: ", path,
           " is too short or unreadable (", map.size, " bytes)");
  const auto* bytes = static_cast<const unsigned char*>(map.data);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  HP_CHECK(n <= map.size - 8, "load_safetensors: ", path, " header length ", n,
           " exceeds the file size ", map.size);
  YAML::Node header;
  try {
    header = YAML::Load(std::string(reinterpret_cast<const char*>(bytes + 8), n));
  } catch (const std::exception& e) {
    throw Error("load_safetensors: " + path + ": malformed JSON header: " + e.what());
  }
  const size_t data_start = 8 + n, data_size = map.size - data_start;
  std::set<std::string> in_file;
  for (const auto& kv : header) {
    const std::string key = kv.first.as<std::string>();
    if (key != "__metadata__") in_file.insert(key);
  }
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
    const YAML::Node e = header[fqn];
    const c10::ScalarType dt = dtype_of(e["dtype"].as<std::string>(), path);
    const auto shape = e["shape"].as<std::vector<int64_t>>();
    const auto off = e["data_offsets"].as<std::vector<uint64_t>>();
    HP_CHECK(shape == p->shape, "load_safetensors: ", fqn, " has shape ", c10::IntArrayRef(shape),
             " in ", path, " but ", c10::IntArrayRef(p->shape), " in the model");
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    HP_CHECK(off.size() == 2 && off[1] >= off[0] && off[1] <= data_size &&
                 off[1] - off[0] == static_cast<uint64_t>(numel) * c10::elementSize(dt),
             "load_safetensors: ", fqn, " has inconsistent data_offsets in ", path);
    HP_CHECK(!p->data.is_meta(), "load_safetensors: ", fqn, " is on meta; call to_empty first");
    at::Tensor full = at::from_blob(const_cast<unsigned char*>(bytes) + data_start + off[0], shape,
                                    at::TensorOptions().dtype(dt));
    p->data.copy_(dtensor::take_ranges(full, p->local_ranges()));
  }
}

}  // namespace hyperpar::nn
