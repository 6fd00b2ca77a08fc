#include "collective_status.h"

#include <ATen/ATen.h>

#include <numeric>

namespace hyperpar::checkpoint::detail {
namespace {
std::shared_ptr<comm::Communicator> world_group(comm::World& world) {
  std::vector<int64_t> all(world.size());
  std::iota(all.begin(), all.end(), 0);
  return world.group(all, "world");
}
}  // namespace

bool all_ok(comm::World& world, bool ok, const char* what) {
  at::Tensor failed = at::full({1}, ok ? 0 : 1, at::TensorOptions().dtype(at::kLong));
  if (world.size() > 1) world_group(world)->all_reduce(failed, comm::ReduceOp::kMax, {what});
  return failed.item<int64_t>() == 0;
}

std::vector<bool> any_rank(comm::World& world, const std::vector<bool>& flags, const char* what) {
  at::Tensor t = at::zeros({static_cast<int64_t>(flags.size())}, at::kLong);
  auto a = t.accessor<int64_t, 1>();
  for (size_t i = 0; i < flags.size(); ++i) a[static_cast<int64_t>(i)] = flags[i] ? 1 : 0;
  if (world.size() > 1 && t.numel() > 0)
    world_group(world)->all_reduce(t, comm::ReduceOp::kMax, {what});
  std::vector<bool> out(flags.size());
  for (size_t i = 0; i < flags.size(); ++i) out[i] = a[static_cast<int64_t>(i)] != 0;
  return out;
}

int64_t broadcast_from_rank0(comm::World& world, int64_t v) {
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kLong));
  if (world.size() > 1) world_group(world)->broadcast(t, 0, {"checkpoint id"});
  return t.item<int64_t>();
}

}  // namespace hyperpar::checkpoint::detail
