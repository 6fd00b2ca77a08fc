#pragma once
// Checks, before training starts, that an output file (--metrics, --profile) can be written,
// so that a bad path is a usage error on every rank rather than a failure after hours.
//
// Every rank checks; rank 0 alone later creates (or truncates) the file. The check therefore
// never creates, truncates or removes the path itself: a rank that starts late must not delete
// the file rank 0 has already opened (it would go on writing to an unlinked inode and the job
// would end "successfully" with no metrics). An existing file is opened for appending without
// writing; a missing one is probed by creating and removing a uniquely named file beside it.
//
//   check_output_path("--metrics", "runs/a/metrics.jsonl");  // creates runs/a/ if needed
//   check_output_path("--metrics", "/proc/m.jsonl");  // throws "... is not writable: ..."
#include <string>

namespace hyperpar::train {

/// Throws ConfigError naming `flag` and `path` when the path is a directory, its directory
/// cannot be created, or a file cannot be written there. An empty path passes.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace hyperpar::train
