#include "hyperpar/dtensor/dtensor.h"

#include <ATen/ATen.h>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"

namespace hyperpar::dtensor {
namespace {
at::Tensor index_of(const IndexRanges& ranges) {
  std::vector<int64_t> idx;
  for (const auto& r : ranges)
    for (int64_t i = r.start; i < r.start + r.size; ++i) idx.push_back(i);
  return at::tensor(idx, at::TensorOptions().dtype(at::kLong));
}
}  // namespace

at::Tensor take_ranges(const at::Tensor& full, const std::vector<IndexRanges>& ranges) {
  HP_CHECK(static_cast<int64_t>(ranges.size()) == full.dim(), "take_ranges: ", ranges.size(),
           " range lists for a ", full.dim(), "-D tensor");
  at::Tensor out = full;
  for (int64_t d = 0; d < full.dim(); ++d) {
    const auto& r = ranges[d];
    if (r.size() == 1)
      out = out.narrow(d, r[0].start, r[0].size);
    else if (r.empty())
      out = out.narrow(d, 0, 0);
    else
      out = out.index_select(d, index_of(r));
  }
  return out.contiguous();
}

void put_ranges(at::Tensor& full, const std::vector<IndexRanges>& ranges, const at::Tensor& block) {
  at::Tensor idx_block = block;
  // Write dim by dim: narrow where one range, index_copy_ through a staging copy otherwise.
  std::function<void(at::Tensor, const at::Tensor&, int64_t)> put =
      [&](at::Tensor dst, const at::Tensor& src, int64_t d) {
        if (d == dst.dim()) {
          dst.copy_(src);
          return;
        }
        int64_t off = 0;
        for (const auto& r : ranges[d]) {
          put(dst.narrow(d, r.start, r.size), src.narrow(d, off, r.size), d + 1);
          off += r.size;
        }
      };
  put(full, idx_block, 0);
}

DTensor::DTensor(at::Tensor local, DTensorSpec spec)
    : local_(std::move(local)), spec_(std::move(spec)) {
  const auto want = spec_.local_shape();
  HP_CHECK(local_.sizes().vec() == want, "DTensor: local tensor of shape ", local_.sizes(),
           " does not match ", spec_.to_string(), " (local shape here ", c10::IntArrayRef(want),
           ")");
}

DTensor DTensor::from_local(at::Tensor local, const mesh::DeviceMesh& mesh, Placements placements,
                            std::optional<std::vector<int64_t>> shape) {
  if (!shape) {
    std::vector<int64_t> s = local.sizes().vec();
    const auto ms = mesh.shape();
    for (size_t m = 0; m < placements.size() && m < ms.size(); ++m) {
      const int64_t d = shard_dim(placements[m]);
      if (d >= 0 && d < static_cast<int64_t>(s.size())) s[d] *= ms[m];
    }
    shape = s;
  }
  return DTensor(std::move(local), DTensorSpec(mesh, std::move(placements), std::move(*shape)));
}

DTensor DTensor::distribute(const at::Tensor& full, const mesh::DeviceMesh& mesh,
                            Placements placements, int64_t src) {
  DTensorSpec spec(mesh, std::move(placements), full.sizes().vec());
  for (const auto& p : spec.placements())
    HP_CHECK(!is_partial(p),
             "distribute: a Partial placement cannot be distributed from a "
             "full tensor (use Replicate, then redistribute)");
  at::Tensor buf = full.contiguous().clone();
  const auto ranks = mesh.ranks();
  HP_CHECK(src >= 0 && src < static_cast<int64_t>(ranks.size()), "distribute: source ", src,
           " is not an index into the mesh's ", ranks.size(), " ranks");
  if (ranks.size() > 1 && buf.numel() > 0)
    mesh.world()->group(ranks, "mesh " + mesh.to_string())->broadcast(buf, src, {"distribute"});
  return DTensor(take_ranges(buf, spec.local_ranges()), spec);
}

at::Tensor DTensor::to_local(const Placements& grad_placements) const {
  return redistribute_local(local_, spec_, spec_.placements(), grad_placements);
}

at::Tensor DTensor::full_tensor() const {
  return redistribute_local(local_, spec_, Placements(spec_.placements().size(), Replicate{}));
}

DTensor DTensor::redistribute(const Placements& placements,
                              const std::optional<Placements>& grad_placements,
                              const std::string& tag) const {
  at::Tensor out = redistribute_local(local_, spec_, placements, grad_placements, tag);
  return DTensor(out, spec_.with_placements(placements));
}

}  // namespace hyperpar::dtensor
