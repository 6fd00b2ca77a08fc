// hyperpar-data: makes token files for data.path from text, with byte-level tokens (each byte
// is one id, vocab_size 256: no tokenizer needed).
//
//   hyperpar-data bytes --out data/licenses --val_fraction 0.1 /usr/share/common-licenses
//   -> data/licenses/train.bin, data/licenses/val.bin (llm.c format, uint16 ids)
//
// Inputs are files or directories (read recursively, in sorted order; symbolic links inside
// a directory are skipped, so a link to a file already read does not count twice). Each
// input file is split: its last val_fraction of bytes go to val.bin, the rest to train.bin.
// Prints the tokens written to each file. For a Hugging Face tokenizer instead of bytes:
// scripts/tokenize_hf.py writes the same formats.
//
//   hyperpar-data batches --config configs/single.yaml --set train.steps=12 --out b.safetensors
//   -> every training step's global batch as hyperpar-train reads it (synthetic or files):
//      tokens and targets [steps, global_batch_size, seq_len] int64, so that another
//      implementation (bench/peer/) trains on exactly the same batches.
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "hyperpar/core/error.h"
#include "hyperpar/data/token_file.h"
#include "hyperpar/nn/safetensors.h"
#include "hyperpar/train/config.h"

using namespace hyperpar;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> out;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        if (it->is_symlink(ec)) continue;
        if (it->is_regular_file(ec)) found.push_back(it->path().string());
      }
      if (ec) throw UsageError("cannot read directory " + in + ": " + ec.message());
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      out.push_back(in);
    } else {
      throw UsageError(in + " is neither a file nor a directory");
    }
  }
  if (out.empty()) throw UsageError("no input files");
  return out;
}

int bytes_command(const std::string& out, double val_fraction, const std::string& format,
                  const std::vector<std::string>& inputs) {
  if (val_fraction < 0 || val_fraction >= 1)
    throw UsageError("--val_fraction must be in [0, 1), got " + std::to_string(val_fraction));
  const data::TokenFormat f = data::parse_token_format(format, "--format");
  if (f == data::TokenFormat::kAuto) throw UsageError("--format must be u16, u32 or llmc");
  const auto files = input_files(inputs);
  fs::create_directories(out);
  data::TokenFileWriter train(out + "/train.bin", f);
  std::optional<data::TokenFileWriter> val;
  if (val_fraction > 0) val.emplace(out + "/val.bin", f);
  int64_t bytes_read = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError("cannot read " + path);
    std::vector<char> text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<uint32_t> ids(text.begin(), text.end());
    for (auto& id : ids) id &= 0xffu;  // char may be signed: the byte's value
    const auto n_val =
        val ? static_cast<size_t>(static_cast<double>(ids.size()) * val_fraction) : 0;
    train.append(ids.data(), ids.size() - n_val);
    if (n_val) val->append(ids.data() + ids.size() - n_val, n_val);
    bytes_read += static_cast<int64_t>(ids.size());
  }
  train.finish();
  std::cout << "hyperpar-data: " << files.size() << " files, " << bytes_read << " bytes\n"
            << "  " << out << "/train.bin: " << train.tokens() << " tokens ("
            << data::token_format_name(f) << ", vocab_size 256)\n";
  if (val) {
    val->finish();
    std::cout << "  " << out << "/val.bin: " << val->tokens() << " tokens\n";
  }
  return 0;
}

int batches_command(const std::string& config, const std::vector<std::string>& sets,
                    const std::string& out) {
  train::Config c = train::load_config(config, sets);
  train::validate(c, c.parallel.pp * c.parallel.tp * c.parallel.dp_replicate *
                         std::max<int64_t>(1, c.parallel.dp_shard));
  const auto& t = c.train;
  data::DataLoader loader(c.data, t.seq_len, c.model.vocab_size, t.global_batch_size, t.seed, 0);
  std::vector<at::Tensor> tokens, targets;
  for (int64_t step = 1; step <= t.steps; ++step) {
    const data::Batch b = loader.train_rows(step, 0, t.global_batch_size);
    tokens.push_back(b.tokens);
    targets.push_back(b.targets);
  }
  nn::write_safetensors_file(out, {{"tokens", at::stack(tokens)}, {"targets", at::stack(targets)}},
                             {{"steps", std::to_string(t.steps)}}, false);
  std::cout << "hyperpar-data: " << t.steps << " batches of " << t.global_batch_size << " x "
            << t.seq_len << " tokens -> " << out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hyperpar-data: token files for hyperpar-train's data.path"};
  app.require_subcommand(1);
  std::string out, format = "llmc";
  double val_fraction = 0.1;
  std::vector<std::string> inputs;
  auto* bytes = app.add_subcommand("bytes", "byte-level tokens (vocab 256) from text files");
  bytes->add_option("--out", out, "output directory (train.bin, val.bin)")->required();
  bytes->add_option("--val_fraction", val_fraction, "share of each file for val.bin (0.1)");
  bytes->add_option("--format", format, "llmc (default, self-describing), u16 or u32");
  bytes->add_option("inputs", inputs, "text files or directories")->required();
  std::string config;
  std::vector<std::string> sets;
  auto* batches = app.add_subcommand("batches", "every training step's batch of a config");
  batches->add_option("--config", config, "hyperpar-train config (YAML)")->required();
  batches->add_option("--set", sets, "section.key=value override (repeatable)");
  batches->add_option("--out", out, "output safetensors file")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (batches->parsed()) return batches_command(config, sets, out);
    return bytes_command(out, val_fraction, format, inputs);
  } catch (const UsageError& e) {
    std::cerr << "hyperpar-data: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hyperpar-data: " << e.what() << "\n";
    return 1;
  }
}
