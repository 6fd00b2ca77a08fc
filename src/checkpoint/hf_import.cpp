#include "hyperpar/checkpoint/hf_import.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "collective_status.h"
#include "hyperpar/checkpoint/boxes.h"
#include "hyperpar/checkpoint/hf_names.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"
#include "hyperpar/nn/parameter.h"
#include "hyperpar/nn/safetensors.h"

namespace hyperpar::checkpoint {
namespace fs = std::filesystem;
namespace {

class HFFiles {
 public:
  explicit HFFiles(const std::string& dir) {
    std::vector<std::string> paths;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    if (paths.empty())
      throw UsageError("model.init_from: " + dir + " holds no *.safetensors weights");
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      files_.push_back(std::make_unique<nn::SafetensorsFile>(p));
      for (const auto& [name, entry] : files_.back()->entries()) where_[name] = files_.back().get();
    }
  }
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  std::vector<int64_t> shape(const std::string& name) const {
    return where_.at(name)->entries().at(name).shape;
  }
  at::Tensor view(const std::string& name) const { return where_.at(name)->view(name); }
  void release(const std::string& name) const { where_.at(name)->release(name); }
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (const auto& [n, f] : where_) v.push_back(n);
    return v;
  }

 private:
  std::vector<std::unique_ptr<nn::SafetensorsFile>> files_;
  std::map<std::string, const nn::SafetensorsFile*> where_;
};

// t narrowed to box dims [from, ...) of `box` (dims before `from` are left alone).
at::Tensor narrow_box(at::Tensor t, const Box& box, size_t from, size_t box_dim0) {
  for (size_t d = from; d < box.sizes.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d - from + box_dim0), box.offsets[d], box.sizes[d]);
  return t;
}

// The block `box` of hyperpar tensor `ref` (global coordinates), read from the HF files.
at::Tensor read_block(const HFFiles& f, const HFTensorRef& ref, const std::string& name,
                      const Box& box) {
  switch (ref.kind) {
    case HFTensorRef::kPlain:
      return narrow_box(f.view(name), box, 0, 0).clone();
    case HFTensorRef::kRotaryRows: {
      const int64_t hd = ref.head_dim, r0 = box.offsets[0], r1 = r0 + box.sizes[0];
      const int64_t h0 = r0 / hd, h1 = (r1 + hd - 1) / hd;
      at::Tensor rows = f.view(name).narrow(0, h0 * hd, (h1 - h0) * hd);
      rows = rotary_rows_from_hf(rows, hd);  // whole heads, so the reorder is exact
      Box rest = box;
      rest.offsets[0] = r0 - h0 * hd;
      return narrow_box(rows, rest, 0, 0).clone();
    }
    case HFTensorRef::kExperts: {
      std::vector<at::Tensor> experts;
      for (int64_t e = box.offsets[0]; e < box.offsets[0] + box.sizes[0]; ++e)
        experts.push_back(narrow_box(f.view(ref.expert(e)), box, 1, 0));
      return at::stack(experts);
    }
  }
  return {};
}

}  // namespace

void load_hf(const std::string& dir, nn::Module& model, const HFModelConfig& hf,
             comm::World& world) {
  const HFFiles files(dir);
  const auto params = model.named_parameters();
  // 1. Names and shapes: each rank checks its own parameters; every rank raises if any does.
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> used;
  std::vector<std::pair<HFTensorRef, std::string>> sources;  // per parameter: ref, HF name
  for (const auto& [fqn, p] : params) {
    HFTensorRef ref = hf_tensor_of(fqn, hf.model);
    if (ref.name == "lm_head.weight" && !files.has(ref.name) && hf.tie_word_embeddings)
      ref.name = "model.embed_tokens.weight";
    sources.emplace_back(ref, ref.name);
    auto check = [&](const std::string& name, std::vector<int64_t> want) {
      used.insert(name);
      if (!files.has(name)) {
        missing.push_back(name);
        return;
      }
      if (files.shape(name) != want)
        mismatched.push_back(name + " (file " + format_list(files.shape(name)) + ", " + fqn + " " +
                             format_list(want) + ")");
    };
    if (ref.kind == HFTensorRef::kExperts) {
      const std::vector<int64_t> one(p->shape.begin() + 1, p->shape.end());
      for (int64_t e = 0; e < p->shape[0]; ++e) check(ref.expert(e), one);
    } else {
      check(ref.name, p->shape);
    }
  }
  // A tensor of the files is unexpected when no rank uses it (with pipeline parallelism each
  // rank holds only its stages' parameters): one all-reduce of a flag per file tensor.
  const auto names = files.names();
  std::vector<bool> mine;
  for (const auto& n : names) mine.push_back(used.count(n) > 0);
  const auto used_anywhere = detail::any_rank(world, mine, "model.init_from: names");
  for (size_t i = 0; i < names.size(); ++i)
    if (!used_anywhere[i] && names[i].find("rotary_emb.inv_freq") == std::string::npos)
      unexpected.push_back(names[i]);
  const bool names_ok = missing.empty() && mismatched.empty() && unexpected.empty();
  if (!detail::all_ok(world, names_ok, "model.init_from: names")) {
    if (names_ok)
      throw UsageError("model.init_from: the weights in " + dir +
                       " do not match the model on another rank (see its log); nothing was loaded");
    std::ostringstream os;
    os << "model.init_from: the weights in " << dir << " do not match the model of its "
       << "config.json;";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      os << " " << what << ":";
      for (size_t i = 0; i < v.size() && i < 8; ++i) os << " " << v[i];
      if (v.size() > 8) os << " (and " << v.size() - 8 << " more)";
      os << ";";
    };
    list("missing", missing);
    list("shape mismatch", mismatched);
    list("unexpected", unexpected);
    os << " nothing was loaded";
    throw UsageError(os.str());
  }
  // 2. Each rank reads the blocks of its own boxes.
  std::string error;
  try {
    at::NoGradGuard no_grad;
    size_t i = 0;
    for (const auto& [fqn, p] : params) {
      const auto& [ref, name] = sources[i++];
      HP_CHECK(!p->data.is_meta(), "model.init_from: ", fqn, " is on meta; materialise first");
      for (const Box& box : boxes_of(p->local_ranges())) {
        at::Tensor dst = p->data;
        for (size_t d = 0; d < box.sizes.size(); ++d)
          dst = dst.narrow(static_cast<int64_t>(d), box.local_offsets[d], box.sizes[d]);
        dst.copy_(read_block(files, ref, name, box));
      }
      if (ref.kind == HFTensorRef::kExperts) {
        for (int64_t e = 0; e < p->shape[0]; ++e) files.release(ref.expert(e));
      } else {
        files.release(name);
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!detail::all_ok(world, error.empty(), "model.init_from: read"))
    throw Error(error.empty() ? "model.init_from: reading failed on another rank (see its log)"
                              : error);
}

}  // namespace hyperpar::checkpoint
