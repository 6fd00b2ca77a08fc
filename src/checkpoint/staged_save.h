#pragma once
// The phases of a save, shared by the synchronous save() and the asynchronous saver:
//   stage_save     (collective: agrees on the directory id) groups this rank's boxes into
//                  files, copying them when the save is asynchronous
//   write_staged   (this rank, no communication) writes, fsyncs and digests its files, then
//                  its rank manifest, whose appearance marks them complete
//   finalise_staged (rank 0, no communication) waits for every rank manifest, writes the
//                  shared files and the manifest, renames DIR/step-N.tmp-<id> to DIR/step-N
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hyperpar/checkpoint/checkpoint.h"

namespace hyperpar::checkpoint {

struct StagedSave {
  std::string dir, tmp, final_path, state_json;
  int64_t step = 0, rank = 0, world_size = 1, keep = 0;
  std::map<size_t, std::vector<std::pair<std::string, at::Tensor>>> parts;
  std::map<size_t, std::string> infos;  // DCP_SHARDING_INFO body per part
};

/// Staging buffers of an asynchronous saver, kept between saves: fresh memory costs a page
/// fault per page (measured: 800 MiB per rank x 8 ranks took 11 s to clone here), a copy
/// into a buffer that is already resident does not.
using StagingPool = std::map<std::string, at::Tensor>;

/// `pool` set: the boxes are copied into its buffers (an asynchronous save); unset: the
/// staged tensors are views of the live data (a synchronous save).
StagedSave stage_save(const std::string& dir, int64_t step, const std::vector<TensorShard>& shards,
                      const std::string& state_json, comm::World& world, const SaveOptions& o,
                      StagingPool* pool);
void write_staged(const StagedSave& st);
void finalise_staged(const StagedSave& st, double wait_s);

}  // namespace hyperpar::checkpoint
