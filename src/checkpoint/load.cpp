#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "collective_status.h"
#include "hyperpar/checkpoint/boxes.h"
#include "hyperpar/checkpoint/checkpoint.h"
#include "hyperpar/checkpoint/manifest.h"
#include "hyperpar/checkpoint/saved_index.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"
#include "hyperpar/nn/safetensors.h"

namespace hyperpar::checkpoint {
namespace fs = std::filesystem;
namespace {

// Copies the parts of the saved chunks that intersect this rank's boxes; returns the number
// of elements written (to check that every element was found). Copies go in slabs of rows
// of at most kSlabBytes of file data, each released from resident memory once copied, so
// loading adds at most one slab to the rank's memory, whatever the tensor sizes.
constexpr int64_t kSlabBytes = 16 << 20;

int64_t read_into(const TensorShard& s, const std::vector<SavedChunk>& chunks) {
  int64_t written = 0;
  const auto mine = boxes_of(s.ranges);
  for (const auto& c : chunks) {
    const at::Tensor chunk = c.file->view(s.fqn);
    const int64_t row_bytes = chunk.dim() == 0 || chunk.size(0) == 0
                                  ? static_cast<int64_t>(chunk.nbytes())
                                  : static_cast<int64_t>(chunk.nbytes()) / chunk.size(0);
    for (const Box& box : mine) {
      const auto inter = intersect(box, c.box);
      if (!inter) continue;
      at::Tensor src = chunk, dst = s.local;
      for (size_t d = 1; d < inter->sizes.size(); ++d) {
        const auto dim = static_cast<int64_t>(d);
        src = src.narrow(dim, inter->offsets[d] - c.box.offsets[d], inter->sizes[d]);
        dst = dst.narrow(dim, box.local_offsets[d] + inter->offsets[d] - box.offsets[d],
                         inter->sizes[d]);
      }
      if (inter->sizes.empty()) {  // a 0-dim tensor
        dst.copy_(src);
        written += 1;
        continue;
      }
      const int64_t src0 = inter->offsets[0] - c.box.offsets[0];
      const int64_t dst0 = box.local_offsets[0] + inter->offsets[0] - box.offsets[0];
      const int64_t slab = std::max<int64_t>(1, kSlabBytes / std::max<int64_t>(1, row_bytes));
      for (int64_t r = 0; r < inter->sizes[0]; r += slab) {
        const int64_t n = std::min(slab, inter->sizes[0] - r);
        dst.narrow(0, dst0 + r, n).copy_(src.narrow(0, src0 + r, n));
        c.file->release(s.fqn, static_cast<size_t>((src0 + r) * row_bytes),
                        static_cast<size_t>((src0 + r + n) * row_bytes));
      }
      written += inter->numel();
    }
  }
  return written;
}

}  // namespace

LoadResult load(const std::string& path, const std::vector<TensorShard>& shards, comm::World& world,
                const LoadOptions& o) {
  // 1. The manifest, verified by all ranks together (each checks every size-th file).
  std::string error;
  Manifest manifest;
  // A directory without a manifest, written by PyTorch's HuggingFaceStorageWriter: its
  // *.safetensors files are read as they are (nothing to verify them against).
  const bool foreign = !fs::exists(path + "/manifest.json") && fs::is_directory(path);
  if (foreign) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") manifest[e.path().filename().string()] = {};
    if (manifest.empty())
      throw UsageError("checkpoint " + path +
                       " has neither a manifest.json nor *.safetensors files");
  }
  try {
    if (!foreign && !fs::exists(path + "/manifest.json"))
      throw UsageError("checkpoint " + path +
                       " does not exist or is not complete (no manifest.json)");
    if (!foreign) manifest = read_manifest(path + "/manifest.json");
    std::vector<std::string> mine;
    int64_t i = 0;
    for (const auto& [name, d] : manifest)
      if (i++ % world.size() == world.rank()) mine.push_back(name);
    const auto problems = foreign ? std::vector<std::string>{} : verify(path, manifest, mine);
    if (!problems.empty()) {
      std::string msg = "checkpoint " + path + " failed verification:";
      for (const auto& p : problems) msg += "\n  " + p;
      throw UsageError(msg);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!detail::all_ok(world, error.empty(), "checkpoint load: verify"))
    throw UsageError(error.empty() ? "checkpoint " + path +
                                         " failed verification on another rank (see its log); "
                                         "nothing was loaded"
                                   : error + "\nnothing was loaded");

  // 2. Names and shapes: each rank checks its own tensors; every rank raises if any does.
  std::vector<std::string> names;
  for (const auto& [name, d] : manifest) names.push_back(name);
  const SavedIndex index(path, names);
  const auto& chunks = index.chunks();
  LoadResult result;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> expected;
  for (const auto& s : shards) {
    expected.insert(s.fqn);
    auto it = chunks.find(s.fqn);
    if (it == chunks.end()) {
      if (!o.strict && s.fqn.rfind("optimizer.", 0) == 0)
        result.missing_allowed.push_back(s.fqn);
      else
        missing.push_back(s.fqn);
      continue;
    }
    const auto saved = SavedIndex::global_shape(it->second);
    if (saved != s.global_shape)
      mismatched.push_back(s.fqn + " (checkpoint " + format_list(saved) + ", model " +
                           format_list(s.global_shape) + ")");
  }
  // A saved tensor is unexpected when no rank holds it (with pipeline parallelism each rank
  // holds only its stages' tensors): one all-reduce of a flag per saved tensor.
  std::vector<bool> mine;
  for (const auto& [fqn, c] : chunks) mine.push_back(expected.count(fqn) > 0);
  const auto held = detail::any_rank(world, mine, "checkpoint load: names");
  std::vector<std::string> extra;
  size_t k = 0;
  for (const auto& [fqn, c] : chunks)
    if (!held[k++]) extra.push_back(fqn);
  const bool names_ok = missing.empty() && mismatched.empty() && extra.empty();
  if (!detail::all_ok(world, names_ok, "checkpoint load: names")) {
    if (names_ok)
      throw UsageError("checkpoint " + path +
                       " does not match the model and optimizer on another rank (see its log); "
                       "nothing was loaded");
    std::ostringstream os;
    os << "checkpoint " << path << " does not match the model and optimizer;";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      os << " " << what << ":";
      for (const auto& n : v) os << " " << n;
      os << ";";
    };
    list("missing", missing);
    list("shape mismatch", mismatched);
    list("unexpected", extra);
    os << " nothing was loaded";
    if (!missing.empty() && o.strict)
      os << " (checkpoint.strict: false allows missing optimizer state)";
    throw UsageError(os.str());
  }

  // 3. Each rank reads the saved boxes that intersect its own, straight into its tensors.
  try {
    at::NoGradGuard no_grad;
    for (const auto& s : shards) {
      auto it = chunks.find(s.fqn);
      if (it == chunks.end()) continue;
      HP_CHECK(!s.local.is_meta(), "checkpoint load: ", s.fqn, " is on meta; materialise first");
      const int64_t got = read_into(s, it->second);
      HP_CHECK(got == s.local.numel(), "checkpoint ", path, ": ", s.fqn, ": the saved boxes cover ",
               got, " of this rank's ", s.local.numel(), " elements");
    }
    std::ifstream f(path + "/hyperpar_state.json");
    std::stringstream ss;
    ss << f.rdbuf();
    result.state_json = ss.str();
    result.foreign = foreign;
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!detail::all_ok(world, error.empty(), "checkpoint load: read"))
    throw Error(error.empty() ? "checkpoint load failed on another rank (see its log)" : error);
  return result;
}

std::vector<TensorShard> collect_shards(nn::Module& model, optim::Optimizer* opt,
                                        int64_t global_rank) {
  std::vector<TensorShard> out;
  std::vector<std::string> names;
  std::vector<nn::Parameter*> params;
  for (auto& [fqn, p] : model.named_parameters()) {
    out.push_back(
        {fqn, p->data, p->shape, p->local_ranges(), writes_replica(p->spec, global_rank)});
    names.push_back(fqn);
    params.push_back(p);
  }
  if (!opt) return out;
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i]] = i;
  for (const auto& st : opt->state_tensors()) {
    const nn::Parameter* p = opt->params()[st.param_index];
    auto it = index.find(p);
    HP_CHECK(it != index.end(), "checkpoint: the optimizer holds a parameter the model does not");
    const TensorShard& ps = out[it->second];
    out.push_back(
        {"optimizer." + st.name + "." + ps.fqn, st.tensor, ps.global_shape, ps.ranges, ps.writer});
  }
  return out;
}

}  // namespace hyperpar::checkpoint
