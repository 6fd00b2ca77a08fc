#pragma once
// The manifest of a checkpoint directory: every data file with its size and its XXH64
// (libxxhash) checksum, in manifest.json. A checkpoint is complete when its directory is
// named step-N (not *.tmp-*) and holds a manifest; verify() checks every listed file.
//
//   {"format": "hyperpar-checkpoint", "version": 1,
//    "files": {"rank-00003-part-0.safetensors": {"bytes": 41288, "xxh64": "9f0c..."}, ...}}
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyperpar::checkpoint {

struct FileDigest {
  uint64_t bytes = 0;
  std::string xxh64;  // 16 hex digits
};
using Manifest = std::map<std::string, FileDigest>;  // file name (in the directory) -> digest

/// Size and XXH64 of a file (streamed; throws naming the file if unreadable).
FileDigest digest_file(const std::string& path);

void write_manifest(const std::string& path, const Manifest& m);
Manifest read_manifest(const std::string& path);

/// Problems with the files of `dir` listed in `m` (missing, truncated, altered), one line
/// each naming the file, the expected and the actual size/hash; `files` limits the check
/// to those names (empty: all).
std::vector<std::string> verify(const std::string& dir, const Manifest& m,
                                const std::vector<std::string>& files = {});

/// fsync of a file or directory (throws on failure).
void fsync_path(const std::string& path);

}  // namespace hyperpar::checkpoint
