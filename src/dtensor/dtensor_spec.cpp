#include "hyperpar/dtensor/dtensor_spec.h"

#include <sstream>

#include "hyperpar/core/error.h"

namespace hyperpar::dtensor {

DTensorSpec::DTensorSpec(mesh::DeviceMesh mesh, Placements placements, std::vector<int64_t> shape)
    : mesh_(std::move(mesh)), placements_(std::move(placements)), shape_(std::move(shape)) {
  HP_CHECK(static_cast<int64_t>(placements_.size()) == mesh_.ndim(),
           "DTensorSpec: ", placements_.size(), " placements ", dtensor::to_string(placements_),
           " for the ", mesh_.ndim(), "-D mesh ", mesh_.to_string(), "; expected one per mesh dim");
  for (int64_t n : shape_) HP_CHECK(n >= 0, "DTensorSpec: negative size in the global shape");
  for (const auto& p : placements_) {
    const int64_t d = shard_dim(p);
    HP_CHECK(d < static_cast<int64_t>(shape_.size()), "DTensorSpec: ", dtensor::to_string(p),
             " shards dim ", d, " but the tensor has ", shape_.size(), " dims");
    HP_CHECK(!is_shard(p) && !is_strided_shard(p) ? true : d >= 0,
             "DTensorSpec: ", dtensor::to_string(p),
             " needs a non-negative dim (normalise negative dims first)");
  }
}

std::vector<int64_t> DTensorSpec::stride() const {
  std::vector<int64_t> s(shape_.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape_.size()) - 2; i >= 0; --i)
    s[i] = s[i + 1] * shape_[i + 1];
  return s;
}

int64_t DTensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t v : shape_) n *= v;
  return n;
}

std::vector<int64_t> DTensorSpec::coordinate() const {
  auto c = mesh_.get_coordinate();
  HP_CHECK(c.has_value(), "rank ", mesh_.world()->rank(), " is not in the mesh ", mesh_.to_string(),
           " of this DTensor");
  return *c;
}

std::vector<IndexRanges> DTensorSpec::local_ranges() const {
  return dtensor::local_ranges(shape_, mesh_.shape(), coordinate(), placements_);
}

std::vector<int64_t> DTensorSpec::local_shape() const {
  return dtensor::local_shape(shape_, mesh_.shape(), coordinate(), placements_);
}

bool DTensorSpec::is_replicated() const {
  for (const auto& p : placements_)
    if (!is_replicate(p)) return false;
  return true;
}

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements_)
    if (is_partial(p)) return true;
  return false;
}

std::string DTensorSpec::to_string() const {
  std::ostringstream os;
  os << "DTensorSpec(shape " << c10::IntArrayRef(shape_) << ", placements "
     << dtensor::to_string(placements_) << ", mesh " << mesh_.to_string() << ")";
  return os.str();
}

bool DTensorSpec::operator==(const DTensorSpec& o) const {
  return shape_ == o.shape_ && placements_ == o.placements_ && mesh_ == o.mesh_;
}

size_t DTensorSpec::hash() const {
  size_t h = mesh_.hash() ^ (hash_value(placements_) * 31);
  for (int64_t v : shape_) h = h * 1000003u ^ std::hash<int64_t>()(v);
  return h;
}

}  // namespace hyperpar::dtensor
