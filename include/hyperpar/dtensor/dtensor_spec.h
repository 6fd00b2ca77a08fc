#pragma once
// DTensorSpec: how a global tensor is laid out on a mesh: the mesh, one placement per mesh
// dim, and the global shape (the global stride is the contiguous one). Validated at
// construction; compared and hashed by value (redistribute plans are cached on it).
//
//   DTensorSpec s(mesh24, {Replicate{}, Shard{0}}, {10, 6});   // (2,4) mesh ("dp","tp")
//   s.local_shape() on tp coordinate 3 -> {1, 6}  (torch.chunk: rows 3,3,3,1)
#include <string>
#include <vector>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/placement.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/mesh/device_mesh.h"

namespace hyperpar::dtensor {

class DTensorSpec {
 public:
  DTensorSpec(mesh::DeviceMesh mesh, Placements placements, std::vector<int64_t> shape);

  const mesh::DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  std::vector<int64_t> stride() const;
  int64_t numel() const;
  /// The calling rank's coordinate (it must be in the mesh).
  std::vector<int64_t> coordinate() const;
  std::vector<IndexRanges> local_ranges() const;
  std::vector<int64_t> local_shape() const;
  /// Same mesh and shape, other placements.
  DTensorSpec with_placements(Placements p) const { return {mesh_, std::move(p), shape_}; }
  bool is_replicated() const;  // every placement Replicate
  bool has_partial() const;

  std::string to_string() const;
  bool operator==(const DTensorSpec& o) const;
  bool operator!=(const DTensorSpec& o) const { return !(*this == o); }
  size_t hash() const;

 private:
  mesh::DeviceMesh mesh_;
  Placements placements_;
  std::vector<int64_t> shape_;
};

}  // namespace hyperpar::dtensor
