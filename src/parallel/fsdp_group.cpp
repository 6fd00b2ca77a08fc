// FSDPGroup's layout, process groups and kept communication buffers (see fsdp_group.h).
#include "fsdp_group.h"

namespace hyperpar::parallel {

void FSDPGroup::ensure_groups() {
  if (shard_group) return;
  shard_group = dp_mesh->get_group(dp_mesh->ndim() - 1);
  if (dp_mesh->ndim() == 2 && dp_mesh->size(0) > 1) replicate_group = dp_mesh->get_group(0);
  const int64_t k = post_forward_size();
  if (k > 1 && k < dp) {
    const auto all = dp_mesh->group_ranks(dp_mesh->ndim() - 1);
    const auto first = all.begin() + (coord / k) * k;
    std::vector<int64_t> block(first, first + k);
    std::string label = "fsdp post-forward ranks [";
    for (size_t i = 0; i < block.size(); ++i) label += (i ? ", " : "") + std::to_string(block[i]);
    reshard_group = dp_mesh->world()->group(block, label + "]");
  }
}

int64_t FSDPGroup::first_row(size_t i, int64_t r) const {
  int64_t row = 0;
  for (int64_t q = 0; q < r; ++q) row += rows(i, q);
  return row;
}

std::vector<int64_t> FSDPGroup::chunk_shape(size_t i, int64_t n) const {
  std::vector<int64_t> s = full_local[i];
  s[dim[i]] = n;
  return s;
}

std::vector<int64_t> FSDPGroup::shard_versions() const {
  std::vector<int64_t> v;
  for (auto* p : params) v.push_back(static_cast<int64_t>(p->data._version()));
  return v;
}

bool FSDPGroup::per_param() {
  if (per_param_cache) return *per_param_cache;
  bool even = post_forward_size() == dp && !params.empty();
  for (size_t i = 0; i < params.size() && even; ++i)
    even =
        dim[i] == 0 && !full_local[i].empty() && full_local[i][0] % dp == 0 && full_local[i][0] > 0;
  per_param_cache = even && opts.collectives == FSDPCollectives::kPerParam;
  stats.per_param_collectives = *per_param_cache;
  return *per_param_cache;
}

at::Tensor& FSDPGroup::reused(at::Tensor& buf, int64_t numel, c10::ScalarType dtype) {
  if (!buf.defined() || buf.numel() != numel || buf.scalar_type() != dtype) {
    buf = at::zeros({numel}, at::TensorOptions().dtype(dtype));
    ++stats.buffer_allocations;
  }
  return buf;
}

}  // namespace hyperpar::parallel
