// hyperpar-ckpt: looks into checkpoints (checkpoint/checkpoint.h) and converts them.
//
//   hyperpar-ckpt inspect ckpt/step-10     one checkpoint
//   hyperpar-ckpt inspect ckpt             the newest complete one in a checkpoint.dir
//   hyperpar-ckpt export --hf OUT ckpt     a Hugging Face model directory (hf_export.h)
//
// Prints the step and the layout it was saved from, every tensor with its global shape,
// dtype and boxes (offsets, sizes, file), and the manifest check (sizes and XXH64 of every
// file). Exit 0 when the checkpoint is intact, 2 when it is not (or cannot be read).
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "hyperpar/checkpoint/checkpoint.h"
#include "hyperpar/checkpoint/hf_export.h"
#include "hyperpar/checkpoint/manifest.h"
#include "hyperpar/checkpoint/saved_index.h"
#include "hyperpar/core/format.h"
#include "hyperpar/nn/safetensors.h"

using namespace hyperpar;

namespace {

// A checkpoint (DIR/step-N) or the newest complete one in a checkpoint.dir.
std::string resolve(const std::string& path) {
  if (std::filesystem::exists(path + "/manifest.json")) return path;
  const std::string newest = checkpoint::latest_complete(path);
  if (newest.empty())
    throw UsageError(path + " is neither a complete checkpoint nor a directory holding one");
  return newest;
}

int export_hf(const std::string& out, const std::string& path, int64_t max_shard,
              const std::string& dtype, bool overwrite) {
  checkpoint::HFExportOptions o;
  o.max_shard_bytes = max_shard;
  o.dtype = dtype;
  o.overwrite = overwrite;
  const std::string dir = resolve(path);
  const auto r = checkpoint::export_hf(dir, out, o);
  std::cout << "hyperpar-ckpt: exported " << dir << " to " << out << " as " << r.architecture
            << ": " << r.tensors << " tensors, " << r.bytes << " bytes (" << dtype << ") in "
            << r.files.size() << (r.files.size() == 1 ? " file" : " files (with an index)") << "\n";
  return 0;
}

int inspect(std::string path) {
  path = resolve(path);
  std::cout << "checkpoint " << path << "\n";
  std::ifstream sf(path + "/hyperpar_state.json");
  std::stringstream state;
  state << sf.rdbuf();
  if (!state.str().empty()) {
    const YAML::Node st = YAML::Load(state.str());
    std::cout << "  step " << st["step"].as<std::string>("?") << ", saved on "
              << st["world_size"].as<std::string>("?") << " ranks, layout "
              << YAML::Dump(st["layout"]).substr(0) << ", hyperpar "
              << st["hyperpar_version"].as<std::string>("?") << "\n";
  }
  const auto manifest = checkpoint::read_manifest(path + "/manifest.json");
  std::vector<std::string> present;  // missing files are reported by the check below
  for (const auto& [name, d] : manifest)
    if (std::filesystem::exists(path + "/" + name)) present.push_back(name);
  const checkpoint::SavedIndex index(path, present);
  std::cout << "  " << index.chunks().size() << " tensors:\n";
  for (const auto& [fqn, chunks] : index.chunks()) {
    const auto& e = chunks.front().file->entries().at(fqn);
    std::cout << "  " << fqn << "  " << c10::toString(e.dtype) << " "
              << format_list(checkpoint::SavedIndex::global_shape(chunks)) << "  " << chunks.size()
              << (chunks.size() == 1 ? " box" : " boxes") << "\n";
    for (const auto& c : chunks)
      std::cout << "      offsets " << format_list(c.box.offsets) << " sizes "
                << format_list(c.box.sizes) << "  "
                << std::filesystem::path(c.file->path()).filename().string() << "\n";
  }
  const auto problems = checkpoint::verify(path, manifest);
  if (problems.empty()) {
    std::cout << "  manifest: " << manifest.size() << " files, sizes and xxh64 all match\n";
    return 0;
  }
  std::cout << "  manifest: " << problems.size() << " problem(s):\n";
  for (const auto& p : problems) std::cout << "    " << p << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hyperpar-ckpt: inspect hyperpar / PyTorch DCP safetensors checkpoints"};
  app.require_subcommand(1);
  std::string dir;
  auto* ins = app.add_subcommand("inspect", "step, layout, tensors, boxes and manifest check");
  ins->add_option("dir", dir, "a checkpoint (DIR/step-N) or a checkpoint.dir")->required();
  std::string out, dtype = "float32";
  int64_t max_shard = int64_t{5} << 30;
  bool overwrite = false;
  auto* exp = app.add_subcommand("export", "convert a checkpoint to another format");
  exp->add_option("--hf", out, "write a Hugging Face model directory here")->required();
  exp->add_option("--max_shard_size", max_shard, "bytes per weight file (5 GiB)");
  exp->add_option("--dtype", dtype, "float32 (default) or bfloat16");
  exp->add_flag("--overwrite", overwrite, "replace an earlier hyperpar export in OUT");
  exp->add_option("dir", dir, "a checkpoint (DIR/step-N) or a checkpoint.dir")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (exp->parsed()) return export_hf(out, dir, max_shard, dtype, overwrite);
    return inspect(dir);
  } catch (const std::exception& e) {
    std::cerr << "hyperpar-ckpt: " << e.what() << "\n";
    return 2;
  }
}
