#include "hyperpar/mesh/device_mesh.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"

namespace hyperpar::mesh {

struct DeviceMesh::Root {
  std::shared_ptr<comm::World> world;
  std::vector<int64_t> ranks;  // flat index -> global rank
  int64_t caller_flat = -1;    // calling rank's flat index, -1 when not in the mesh
  std::vector<Dim> dims;       // root dims
  std::map<std::string, std::vector<MeshMode>> registered;  // flattened / unflattened names
};

namespace {

int64_t dim_size(const DeviceMesh::Dim& d) {
  int64_t n = 1;
  for (const auto& m : d.modes) n *= m.size;
  return n;
}

// A mode's digits are the range [stride, stride * size) of the root's flat index, whatever
// root dim it came from (a merged mode may span several): two modes overlap when their
// ranges do.
bool overlap(const MeshMode& a, const MeshMode& b) {
  if (a.size == 1 || b.size == 1) return a == b;
  return a.stride < b.stride * b.size && b.stride < a.stride * a.size;
}

// True when mode `m` is one of `modes` or a piece of one (a sub-range of its digits).
bool covered(const MeshMode& m, const std::vector<MeshMode>& modes) {
  for (const auto& M : modes) {
    if (M == m) return true;
    if (M.stride <= m.stride && m.stride % M.stride == 0 && m.stride * m.size <= M.stride * M.size)
      return true;
  }
  return false;
}

// Modes are in root order when their strides strictly decrease (outermost digits first).
// Size-1 modes hold no digit and are ignored.
bool in_root_order(const std::vector<MeshMode>& all) {
  std::vector<MeshMode> modes;
  for (const auto& m : all)
    if (m.size > 1) modes.push_back(m);
  for (size_t i = 1; i < modes.size(); ++i)
    if (modes[i - 1].stride <= modes[i].stride) return false;
  return true;
}

// Adjacent modes that are contiguous on the root (outer.stride == inner.stride * inner.size)
// form one digit range: merged, a flattened (4, 3) dim is one mode of size 12, which any
// row-major factorisation (3, 4), (2, 6), ... can split.
std::vector<MeshMode> merge_contiguous(const std::vector<MeshMode>& modes) {
  std::vector<MeshMode> out;
  for (const auto& m : modes) {
    if (m.size == 1) continue;
    if (!out.empty() && out.back().stride == m.stride * m.size)
      out.back() = MeshMode{out.back().size * m.size, m.stride, m.root_dim};
    else
      out.push_back(m);
  }
  return out;
}

std::vector<MeshMode> all_modes(const std::vector<DeviceMesh::Dim>& dims) {
  std::vector<MeshMode> out;
  for (const auto& d : dims) out.insert(out.end(), d.modes.begin(), d.modes.end());
  return out;
}

void check_names(const std::vector<std::string>& names, size_t ndim) {
  HP_CHECK(names.size() == ndim, "mesh has ", ndim, " dims but ", names.size(),
           " dim names were given");
  std::set<std::string> seen;
  for (const auto& n : names) {
    HP_CHECK(!n.empty(), "mesh dim names must not be empty");
    HP_CHECK(seen.insert(n).second, "mesh dim name '", n, "' is used twice");
  }
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<Root> root, std::vector<Dim> dims)
    : root_(std::move(root)), dims_(std::move(dims)) {
  // Coordinate 0 of this mesh holds the caller's digits on every root mode not in it.
  offset_ = 0;
  if (root_->caller_flat >= 0) {
    offset_ = root_->caller_flat;
    for (const auto& m : all_modes(dims_))
      offset_ -= ((root_->caller_flat / m.stride) % m.size) * m.stride;
  }
}

DeviceMesh DeviceMesh::init(std::shared_ptr<comm::World> world, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& names) {
  HP_CHECK(world, "init_device_mesh needs a world");
  int64_t n = 1;
  for (int64_t s : shape) {
    HP_CHECK(s > 0, "mesh dim sizes must be positive, got shape ", format_list(shape));
    n *= s;
  }
  HP_CHECK(!shape.empty(), "a mesh needs at least one dim");
  HP_CHECK(n == world->size(), "mesh shape ", format_list(shape), " holds ", n,
           " ranks but the world has ", world->size());
  std::vector<int64_t> ranks(n);
  for (int64_t i = 0; i < n; ++i) ranks[i] = i;
  return from_ranks(std::move(world), shape, ranks, names);
}

DeviceMesh DeviceMesh::from_ranks(std::shared_ptr<comm::World> world,
                                  const std::vector<int64_t>& shape,
                                  const std::vector<int64_t>& ranks,
                                  const std::vector<std::string>& names) {
  HP_CHECK(world, "a mesh needs a world");
  HP_CHECK(!shape.empty(), "a mesh needs at least one dim");
  int64_t n = 1;
  for (int64_t s : shape) {
    HP_CHECK(s > 0, "mesh dim sizes must be positive, got shape ", format_list(shape));
    n *= s;
  }
  HP_CHECK(static_cast<int64_t>(ranks.size()) == n, "mesh shape ", format_list(shape), " needs ", n,
           " ranks, got ", ranks.size());
  check_names(names, shape.size());
  auto root = std::make_shared<Root>();
  root->world = world;
  root->ranks = ranks;
  // One byte per world rank (not a node per rank): 131072 ranks validate in ~0.1 ms.
  std::vector<char> seen(static_cast<size_t>(world->size()), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ranks[i];
    HP_CHECK(r >= 0 && r < world->size(), "mesh rank ", r, " is outside the world [0, ",
             world->size(), ")");
    HP_CHECK(!seen[static_cast<size_t>(r)], "mesh rank ", r, " appears twice");
    seen[static_cast<size_t>(r)] = 1;
    if (r == world->rank()) root->caller_flat = i;
  }
  int64_t stride = n;
  for (size_t d = 0; d < shape.size(); ++d) {
    stride /= shape[d];
    root->dims.push_back(Dim{names[d], {MeshMode{shape[d], stride, static_cast<int64_t>(d)}}});
  }
  return DeviceMesh(root, root->dims);
}

std::vector<int64_t> DeviceMesh::shape() const {
  std::vector<int64_t> s;
  for (const auto& d : dims_) s.push_back(dim_size(d));
  return s;
}

int64_t DeviceMesh::size() const {
  int64_t n = 1;
  for (const auto& d : dims_) n *= dim_size(d);
  return n;
}

int64_t DeviceMesh::size(int64_t dim) const {
  HP_CHECK(dim >= 0 && dim < ndim(), "mesh dim ", dim, " out of range for ", to_string());
  return dim_size(dims_[dim]);
}

std::vector<std::string> DeviceMesh::dim_names() const {
  std::vector<std::string> n;
  for (const auto& d : dims_) n.push_back(d.name);
  return n;
}

int64_t DeviceMesh::dim_index(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == name) return static_cast<int64_t>(i);
  throw Error("mesh has no dim named '" + name + "': " + to_string());
}

int64_t DeviceMesh::flat_of(const std::vector<int64_t>& coord) const {
  int64_t flat = offset_;
  for (size_t d = 0; d < dims_.size(); ++d) {
    int64_t c = coord[d];
    for (auto it = dims_[d].modes.rbegin(); it != dims_[d].modes.rend(); ++it) {
      flat += (c % it->size) * it->stride;
      c /= it->size;
    }
  }
  return flat;
}

std::vector<int64_t> DeviceMesh::coord_of_flat(int64_t flat) const {
  std::vector<int64_t> coord;
  for (const auto& d : dims_) {
    int64_t c = 0;
    for (const auto& m : d.modes) c = c * m.size + (flat / m.stride) % m.size;
    coord.push_back(c);
  }
  return coord;
}

bool DeviceMesh::contains_flat(int64_t flat) const {
  return flat >= 0 && flat_of(coord_of_flat(flat)) == flat;
}

void DeviceMesh::require_member(const char* op) const {
  HP_CHECK(contains_flat(root_->caller_flat), op, ": rank ", root_->world->rank(), " is not in ",
           to_string());
}

std::vector<int64_t> DeviceMesh::ranks() const {
  const auto s = shape();
  std::vector<int64_t> coord(s.size(), 0), out;
  out.reserve(size());
  for (int64_t i = 0; i < size(); ++i) {
    out.push_back(root_->ranks[flat_of(coord)]);
    for (int64_t d = ndim() - 1; d >= 0; --d) {
      if (++coord[d] < s[d]) break;
      coord[d] = 0;
    }
  }
  return out;
}

std::optional<std::vector<int64_t>> DeviceMesh::get_coordinate() const {
  if (!contains_flat(root_->caller_flat)) return std::nullopt;
  return coord_of_flat(root_->caller_flat);
}

int64_t DeviceMesh::get_local_rank(int64_t dim) const {
  size(dim);  // range check
  require_member("get_local_rank");
  return coord_of_flat(root_->caller_flat)[dim];
}

namespace {
bool has_dim(const std::vector<DeviceMesh::Dim>& dims, const std::string& name) {
  for (const auto& d : dims)
    if (d.name == name) return true;
  return false;
}
}  // namespace

int64_t DeviceMesh::get_local_rank(const std::string& name) const {
  if (has_dim(dims_, name)) return get_local_rank(dim_index(name));
  return slice({name}).get_local_rank(0);
}

std::shared_ptr<comm::Communicator> DeviceMesh::get_group(const std::string& name) const {
  if (has_dim(dims_, name)) return get_group(dim_index(name));
  return slice({name}).get_group(0);
}

std::vector<int64_t> DeviceMesh::group_ranks(int64_t dim) const {
  size(dim);
  require_member("group_ranks");
  auto coord = coord_of_flat(root_->caller_flat);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(dim); ++i) {
    coord[dim] = i;
    out.push_back(root_->ranks[flat_of(coord)]);
  }
  return out;
}

std::vector<std::vector<int64_t>> DeviceMesh::all_group_ranks(int64_t dim) const {
  const int64_t n = size(dim);
  const auto all = ranks();
  const auto s = shape();
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < ndim(); ++d) inner *= s[d];
  std::vector<std::vector<int64_t>> groups;
  for (int64_t outer = 0; outer < size() / (n * inner); ++outer)
    for (int64_t in = 0; in < inner; ++in) {
      std::vector<int64_t> g;
      for (int64_t i = 0; i < n; ++i) g.push_back(all[(outer * n + i) * inner + in]);
      groups.push_back(g);
    }
  return groups;
}

std::shared_ptr<comm::Communicator> DeviceMesh::get_group(int64_t dim) const {
  const auto r = group_ranks(dim);
  return root_->world->group(r, "mesh dim " + dims_[dim].name + " ranks " + format_list(r));
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  HP_CHECK(!names.empty(), "slicing a mesh needs at least one dim name");
  require_member("slicing");
  std::vector<Dim> picked;
  // Merged, so that a piece spanning two of this mesh's dims (a factor of a flattened dim)
  // counts as part of it.
  const auto mine = merge_contiguous(all_modes(dims_));
  for (const auto& name : names) {
    std::optional<Dim> d;
    for (const auto& own : dims_)
      if (own.name == name) d = own;
    if (!d) {
      auto it = root_->registered.find(name);
      if (it != root_->registered.end()) {
        for (const auto& m : it->second)
          HP_CHECK(covered(m, mine), "dim '", name,
                   "' is registered on the root but is not part of ", to_string());
        d = Dim{name, it->second};
      }
    }
    HP_CHECK(d, "mesh has no dim named '", name, "': ", to_string());
    picked.push_back(*d);
  }
  check_names(std::vector<std::string>(names), picked.size());
  const auto modes = all_modes(picked);
  for (size_t i = 0; i < modes.size(); ++i)
    for (size_t j = i + 1; j < modes.size(); ++j)
      HP_CHECK(!overlap(modes[i], modes[j]), "sliced dims overlap in ", to_string());
  HP_CHECK(in_root_order(modes),
           "sliced dim names must follow the root mesh's dim order: ", root_->dims.size(),
           "-D root ", DeviceMesh(root_, root_->dims).to_string());
  return DeviceMesh(root_, picked);
}

namespace {
void register_name(DeviceMesh::Root& root, const std::string& name,
                   const std::vector<MeshMode>& modes) {
  for (const auto& d : root.dims)
    if (d.name == name) {
      HP_CHECK(d.modes == modes, "name '", name,
               "' is already a root mesh dim with another layout");
      return;
    }
  auto [it, inserted] = root.registered.emplace(name, modes);
  HP_CHECK(inserted || it->second == modes, "mesh dim name '", name,
           "' was already registered on the root with a different layout");
}
}  // namespace

DeviceMesh DeviceMesh::flatten(const std::string& name) const {
  require_member("flatten");
  std::string n = name;
  if (n.empty())
    for (size_t i = 0; i < dims_.size(); ++i) n += (i ? "_" : "") + dims_[i].name;
  const auto modes = all_modes(dims_);
  register_name(*root_, n, modes);
  return DeviceMesh(root_, {Dim{n, modes}});
}

DeviceMesh DeviceMesh::unflatten(int64_t dim, const std::vector<int64_t>& sizes,
                                 const std::vector<std::string>& names) const {
  require_member("unflatten");
  size(dim);
  check_names(names, sizes.size());
  int64_t prod = 1;
  for (int64_t s : sizes) {
    HP_CHECK(s > 0, "unflatten sizes must be positive, got ", format_list(sizes));
    prod *= s;
  }
  HP_CHECK(prod == size(dim), "unflatten sizes ", format_list(sizes), " multiply to ", prod,
           " but dim '", dims_[dim].name, "' has size ", size(dim));
  // Split the dim's modes row-major, consuming digits from the innermost mode outwards.
  std::vector<MeshMode> rest = merge_contiguous(dims_[dim].modes);
  // The root dim holding a digit at `stride` (informational: pieces of merged modes).
  auto root_dim_at = [this](int64_t stride) {
    for (size_t d = 0; d < root_->dims.size(); ++d)
      for (const auto& m : root_->dims[d].modes)
        if (m.stride <= stride && stride < m.stride * m.size) return static_cast<int64_t>(d);
    return static_cast<int64_t>(root_->dims.size()) - 1;
  };
  std::vector<Dim> split(sizes.size());
  for (int64_t k = static_cast<int64_t>(sizes.size()) - 1; k >= 0; --k) {
    int64_t need = sizes[k];
    std::vector<MeshMode> taken;
    while (need > 1) {
      HP_CHECK(!rest.empty(), "cannot unflatten");
      MeshMode m = rest.back();
      if (m.size == 1) {
        rest.pop_back();
        continue;
      }
      if (need % m.size == 0) {
        taken.insert(taken.begin(), MeshMode{m.size, m.stride, root_dim_at(m.stride)});
        rest.pop_back();
        need /= m.size;
      } else if (m.size % need == 0) {
        taken.insert(taken.begin(), MeshMode{need, m.stride, root_dim_at(m.stride)});
        rest.back() = MeshMode{m.size / need, m.stride * need, root_dim_at(m.stride * need)};
        need = 1;
      } else {
        throw Error(detail::concat("cannot unflatten dim '", dims_[dim].name, "' into ",
                                   format_list(sizes), ": size ", sizes[k],
                                   " does not align with its layout"));
      }
    }
    if (taken.empty()) {
      const MeshMode& anchor = rest.empty() ? dims_[dim].modes.front() : rest.back();
      taken.push_back(MeshMode{1, anchor.stride, anchor.root_dim});
    }
    split[k] = Dim{names[k], taken};
  }
  std::vector<Dim> dims;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d != dim) {
      dims.push_back(dims_[d]);
      continue;
    }
    for (auto& s : split) {
      for (const auto& other : dims_)
        HP_CHECK(other.name == dims_[dim].name || other.name != s.name, "unflatten name '", s.name,
                 "' clashes with dim of ", to_string());
      register_name(*root_, s.name, s.modes);
      dims.push_back(s);
    }
  }
  return DeviceMesh(root_, dims);
}

at::Tensor DeviceMesh::mesh_tensor() const {
  const auto r = ranks();
  // Explicit CPU device: never the ambient DeviceContext (invariant 1).
  return at::tensor(r, at::TensorOptions().dtype(at::kLong).device(at::kCPU)).reshape(shape());
}

const std::shared_ptr<comm::World>& DeviceMesh::world() const { return root_->world; }

std::string DeviceMesh::to_string() const {
  std::ostringstream os;
  os << "DeviceMesh(";
  for (size_t i = 0; i < dims_.size(); ++i)
    os << (i ? ", " : "") << dims_[i].name << "=" << dim_size(dims_[i]);
  const auto r = ranks();
  os << "; ranks ";
  if (r.size() <= 16) {
    os << format_list(r);
  } else {
    os << "[" << r[0] << ", " << r[1] << ", ..., " << r.back() << "] (" << r.size() << ")";
  }
  os << ")";
  return os.str();
}

bool DeviceMesh::operator==(const DeviceMesh& o) const {
  return shape() == o.shape() && dim_names() == o.dim_names() && ranks() == o.ranks();
}

size_t DeviceMesh::hash() const {
  size_t h = 1469598103934665603ull;
  auto mix = [&h](size_t v) { h = (h ^ v) * 1099511628211ull; };
  for (int64_t s : shape()) mix(static_cast<size_t>(s));
  for (const auto& n : dim_names()) mix(std::hash<std::string>()(n));
  for (int64_t r : ranks()) mix(static_cast<size_t>(r));
  return h;
}

DeviceMesh concatenate(const std::vector<DeviceMesh>& meshes) {
  HP_CHECK(!meshes.empty(), "concatenate needs at least one mesh");
  std::vector<DeviceMesh::Dim> dims;
  for (const auto& m : meshes) {
    HP_CHECK(m.root_ == meshes[0].root_, "concatenate: meshes ", meshes[0].to_string(), " and ",
             m.to_string(), " come from different root meshes");
    m.require_member("concatenate");
    dims.insert(dims.end(), m.dims_.begin(), m.dims_.end());
  }
  const auto modes = all_modes(dims);
  for (size_t i = 0; i < modes.size(); ++i)
    for (size_t j = i + 1; j < modes.size(); ++j)
      HP_CHECK(!overlap(modes[i], modes[j]), "concatenate: meshes share a dim (overlap)");
  HP_CHECK(in_root_order(modes), "concatenate: meshes must be given in root dim order");
  std::vector<std::string> names;
  for (const auto& d : dims) names.push_back(d.name);
  check_names(names, dims.size());
  return DeviceMesh(meshes[0].root_, dims);
}

}  // namespace hyperpar::mesh
