#pragma once
// DeviceMesh: an N-D array of global ranks with named dims (PyTorch's
// torch.distributed.device_mesh semantics). All metadata is host integers (DESIGN.md
// invariant 1): nothing here creates a tensor or reads the ambient DeviceContext, so a mesh
// built, sliced, flattened or concatenated under DeviceContext(meta) is identical to one
// built outside it.
//
// Worked example, (2,4) mesh ("dp","tp") over ranks 0..7, seen from rank 5:
//   mesh.get_coordinate()        -> {1, 1}
//   mesh["dp"].ranks()           -> {1, 5}
//   mesh["tp"].ranks()           -> {4, 5, 6, 7}
//   mesh.flatten().ranks()       -> {0..7}, dim "dp_tp"; root["dp_tp"] resolves it
//   mesh["tp"].unflatten(0, {2, 2}, {"a", "b"})["b"].ranks() -> {4, 5}
//   mesh.flatten("all").unflatten(0, {4, 2}, {"x", "y"})["y"].ranks() -> {4, 5}
//     (row-major, as PyTorch: any factorisation of a flattened dim, e.g. (4,3) -> (3,4))
//   mesh.get_local_rank("dp_tp") -> 5 once "dp_tp" is flattened on the root
//   concatenate({mesh["dp"], mesh["tp"]}) == mesh
//
// Internally every dim is a list of modes (size, stride) over the root's flat index, so a
// flattened or unflattened dim is still a view of the root layout and concatenation is a
// union of modes. Slicing needs the calling rank to be in the mesh.
#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperpar/comm/world.h"

namespace hyperpar::mesh {

/// One mixed-radix digit of the root's flat index: digit = (flat / stride) % size.
struct MeshMode {
  int64_t size;
  int64_t stride;
  int64_t root_dim;  // which root dim this digit belongs to (orders modes)
  bool operator==(const MeshMode& o) const {
    return size == o.size && stride == o.stride && root_dim == o.root_dim;
  }
};

class DeviceMesh {
 public:
  /// Mesh over all ranks of `world` in row-major order (init_device_mesh).
  static DeviceMesh init(std::shared_ptr<comm::World> world, const std::vector<int64_t>& shape,
                         const std::vector<std::string>& names);
  /// Mesh over an explicit N-D array of global ranks, given row-major with its shape.
  static DeviceMesh from_ranks(std::shared_ptr<comm::World> world,
                               const std::vector<int64_t>& shape, const std::vector<int64_t>& ranks,
                               const std::vector<std::string>& names);

  int64_t ndim() const { return static_cast<int64_t>(dims_.size()); }
  std::vector<int64_t> shape() const;
  int64_t size() const;  // number of ranks
  int64_t size(int64_t dim) const;
  int64_t size(const std::string& name) const { return size(dim_index(name)); }
  std::vector<std::string> dim_names() const;
  int64_t dim_index(const std::string& name) const;

  /// All ranks of this mesh, row-major.
  std::vector<int64_t> ranks() const;
  /// Calling rank's coordinate; nullopt when the rank is not in the mesh.
  std::optional<std::vector<int64_t>> get_coordinate() const;
  int64_t get_local_rank(int64_t dim) const;
  /// By name: one of this mesh's dims, or a name flattened/unflattened on the root (as in
  /// PyTorch, root.get_local_rank("dp_shard_tp") after flatten), resolved by slicing.
  int64_t get_local_rank(const std::string& name) const;
  /// Ranks along `dim` through the calling rank's coordinate (its group on that dim).
  std::vector<int64_t> group_ranks(int64_t dim) const;
  /// Every group along `dim` (one rank list per combination of the other coordinates).
  std::vector<std::vector<int64_t>> all_group_ranks(int64_t dim) const;
  /// The communicator of group_ranks(dim): created lazily, shared by equal rank sets.
  std::shared_ptr<comm::Communicator> get_group(int64_t dim) const;
  std::shared_ptr<comm::Communicator> get_group(const std::string& name) const;

  /// Slice by one dim name (mesh["tp"]) or several (mesh.slice({"dp", "tp"}), root order). Names
  /// may be this mesh's dims or names flattened/unflattened on the root.
  DeviceMesh operator[](const std::string& name) const { return slice({name}); }
  DeviceMesh slice(const std::vector<std::string>& names) const;
  /// One dim spanning all of this mesh's dims; registered on the root under `name`
  /// (default: dim names joined by "_").
  DeviceMesh flatten(const std::string& name = "") const;
  /// Splits `dim` into dims of `sizes` (product must equal its size), registered on root.
  DeviceMesh unflatten(int64_t dim, const std::vector<int64_t>& sizes,
                       const std::vector<std::string>& names) const;

  /// Explicit CPU int64 tensor of ranks() shaped shape(); never on an ambient device.
  at::Tensor mesh_tensor() const;
  const std::shared_ptr<comm::World>& world() const;
  std::string to_string() const;
  bool operator==(const DeviceMesh& o) const;
  bool operator!=(const DeviceMesh& o) const { return !(*this == o); }
  size_t hash() const;

  struct Dim {
    std::string name;
    std::vector<MeshMode> modes;
  };
  struct Root;

 private:
  DeviceMesh(std::shared_ptr<Root> root, std::vector<Dim> dims);
  friend DeviceMesh concatenate(const std::vector<DeviceMesh>& meshes);
  int64_t flat_of(const std::vector<int64_t>& coord) const;
  std::vector<int64_t> coord_of_flat(int64_t flat) const;
  bool contains_flat(int64_t flat) const;
  void require_member(const char* op) const;

  std::shared_ptr<Root> root_;
  std::vector<Dim> dims_;
  int64_t offset_ = 0;  // root flat index of coordinate 0
};

/// Union of meshes from one root with disjoint dims given in root order (FSDP combines
/// its data-parallel mesh with a TP/EP mesh this way).
DeviceMesh concatenate(const std::vector<DeviceMesh>& meshes);

}  // namespace hyperpar::mesh

template <>
struct std::hash<hyperpar::mesh::DeviceMesh> {
  size_t operator()(const hyperpar::mesh::DeviceMesh& m) const { return m.hash(); }
};
