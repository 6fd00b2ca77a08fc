#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "collective_status.h"
#include "hyperpar/checkpoint/boxes.h"
#include "hyperpar/checkpoint/checkpoint.h"
#include "hyperpar/checkpoint/manifest.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"
#include "hyperpar/core/worker_record.h"
#include "hyperpar/nn/safetensors.h"
#include "staged_save.h"

namespace hyperpar::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string part_name(int64_t rank, size_t part) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05lld-part-%zu.safetensors", static_cast<long long>(rank),
                part);
  return buf;
}

std::string rank_manifest_name(int64_t rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "manifest.rank-%05lld.json", static_cast<long long>(rank));
  return buf;
}

// The local data of `box` as its own contiguous tensor.
at::Tensor box_data(const at::Tensor& local, const Box& box) {
  at::Tensor t = local;
  for (size_t d = 0; d < box.sizes.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), box.local_offsets[d], box.sizes[d]);
  return t.contiguous();
}

// This rank's boxes grouped into files: part k holds the k-th box of every tensor.
void stage_parts(StagedSave& st, const std::vector<TensorShard>& shards, StagingPool* pool) {
  at::NoGradGuard no_grad;
  for (const auto& s : shards) {
    if (!s.writer) continue;
    HP_CHECK(!s.local.is_meta(), "checkpoint save: ", s.fqn, " is on meta (not materialised)");
    const auto boxes = boxes_of(s.ranges);
    for (size_t k = 0; k < boxes.size(); ++k) {
      at::Tensor data = box_data(s.local.detach(), boxes[k]);
      // Asynchronous saves copy the shards: training goes on updating the originals.
      if (pool) {
        at::Tensor& buf = (*pool)[s.fqn + "#" + std::to_string(k)];
        if (!buf.defined() || buf.sizes() != data.sizes() || buf.dtype() != data.dtype())
          buf = at::empty(data.sizes(), data.options());
        buf.copy_(data);
        data = buf;
      }
      st.parts[k].push_back({s.fqn, data});
      std::string& info = st.infos[k];
      info += (info.empty() ? "" : ", ") + std::string("\"") + s.fqn +
              "\": {\"saved_offsets\": " + format_list(boxes[k].offsets) + "}";
    }
  }
}

// Complete checkpoints in `dir`, oldest first.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of(e.path().string());
    if (step >= 0 && fs::exists(e.path() / "manifest.json"))
      out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// Rank 0, once every rank's files are in `tmp`: the shared files, the manifest, the rename.
void finalise_staged(const StagedSave& st, double wait_s) {
  const std::string &dir = st.dir, &tmp = st.tmp, &final_path = st.final_path;
  const int64_t world_size = st.world_size;
  // Every rank's manifest appears (atomically renamed) once its files are durable; an
  // asynchronous save waits for them here instead of in a collective.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string rm = tmp + "/" + rank_manifest_name(r);
    while (!fs::exists(rm)) {
      HP_CHECK(std::chrono::steady_clock::now() < deadline, "checkpoint save: rank ", r,
               " did not finish writing into ", tmp, " within ", wait_s, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  Manifest m;
  std::map<std::string, std::string> weight_map;
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string rm = tmp + "/" + rank_manifest_name(r);
    for (const auto& [name, d] : read_manifest(rm)) {
      m[name] = d;
      const nn::SafetensorsFile f(tmp + "/" + name);
      for (const auto& [fqn, e] : f.entries()) weight_map.emplace(fqn, name);
    }
    fs::remove(rm);
  }
  {
    std::ofstream f(tmp + "/hyperpar_state.json", std::ios::trunc);
    f << st.state_json << "\n";
    f.flush();
    HP_CHECK(f.good(), "checkpoint: writing ", tmp, "/hyperpar_state.json failed");
  }
  {
    std::ostringstream os;
    os << "{\"metadata\": {\"writer\": \"hyperpar\"}, \"weight_map\": {";
    bool first = true;
    for (const auto& [fqn, file] : weight_map) {
      os << (first ? "\n" : ",\n") << "  \"" << fqn << "\": \"" << file << "\"";
      first = false;
    }
    os << "\n}}\n";
    std::ofstream f(tmp + "/model.safetensors.index.json", std::ios::trunc);
    f << os.str();
    f.flush();
    HP_CHECK(f.good(), "checkpoint: writing the index in ", tmp, " failed");
  }
  for (const char* n : {"hyperpar_state.json", "model.safetensors.index.json"}) {
    fsync_path(tmp + "/" + n);
    m[n] = digest_file(tmp + "/" + n);
  }
  write_manifest(tmp + "/manifest.json", m);
  fsync_path(tmp);
  // Saving a step that exists (a resumed run saving it again): the new one replaces it.
  std::string replaced;
  if (fs::exists(final_path)) {
    replaced = tmp + ".replaced";
    fs::rename(final_path, replaced);
  }
  fs::rename(tmp, final_path);
  fsync_path(dir);
  if (!replaced.empty()) fs::remove_all(replaced);
  if (st.keep > 0) {
    auto all = complete_checkpoints(dir);
    for (size_t i = 0; i + static_cast<size_t>(st.keep) < all.size(); ++i)
      fs::remove_all(all[i].second);
  }
}

StagedSave stage_save(const std::string& dir, int64_t step, const std::vector<TensorShard>& shards,
                      const std::string& state_json, comm::World& world, const SaveOptions& o,
                      StagingPool* pool) {
  StagedSave st;
  st.dir = dir;
  st.step = step;
  st.rank = world.rank();
  st.world_size = world.size();
  st.keep = o.keep;
  st.state_json = state_json;
  const int64_t id = detail::broadcast_from_rank0(world, record::now_ns());
  st.tmp = dir + "/step-" + std::to_string(step) + ".tmp-" + std::to_string(id);
  st.final_path = dir + "/step-" + std::to_string(step);
  stage_parts(st, shards, pool);
  return st;
}

void write_staged(const StagedSave& st) {
  fs::create_directories(st.tmp);
  Manifest mine;
  for (const auto& [k, tensors] : st.parts) {
    const std::string name = part_name(st.rank, k);
    nn::write_safetensors_file(st.tmp + "/" + name, tensors,
                               {{"DCP_SHARDING_INFO", "{" + st.infos.at(k) + "}"},
                                {"format", "pt"},
                                {"writer", "hyperpar"}},
                               /*sync=*/true);
    mine[name] = digest_file(st.tmp + "/" + name);
  }
  // Last: its appearance tells rank 0 that this rank's files are complete and durable.
  write_manifest(st.tmp + "/" + rank_manifest_name(st.rank), mine);
}

int64_t step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  const std::string digits = name.substr(5);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::string latest_complete(const std::string& dir) {
  const auto all = complete_checkpoints(dir);
  return all.empty() ? "" : all.back().second;
}

std::string save(const std::string& dir, int64_t step, const std::vector<TensorShard>& shards,
                 const std::string& state_json, comm::World& world, const SaveOptions& o) {
  StagedSave st = stage_save(dir, step, shards, state_json, world, o, /*pool=*/nullptr);
  std::string error;
  try {
    write_staged(st);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!detail::all_ok(world, error.empty(), "checkpoint save: files"))
    throw Error("checkpoint save of step " + std::to_string(step) + " into " + st.tmp + " failed" +
                (error.empty() ? " on another rank (see its log)" : ": " + error) +
                "; the previous complete checkpoint is untouched");
  if (st.rank == 0) {
    try {
      finalise_staged(st, 0);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!detail::all_ok(world, error.empty(), "checkpoint save: finalise"))
    throw Error("checkpoint save of step " + std::to_string(step) + ": finalising " + st.tmp +
                " failed" + (error.empty() ? " on rank 0 (see its log)" : ": " + error));
  return st.final_path;
}

}  // namespace hyperpar::checkpoint
