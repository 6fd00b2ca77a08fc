#include "hyperpar/dtensor/redistribute/redistribute.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/dtensor/redistribute/planner.h"

namespace hyperpar::dtensor {
namespace {

at::Tensor run_plan(const at::Tensor& local, const DTensorSpec& src, const Placements& dst,
                    const std::string& tag) {
  const auto want = src.local_shape();
  HP_CHECK(local.sizes().vec() == want, "redistribute: local tensor of shape ", local.sizes(),
           " does not match ", src.to_string(), ", whose local shape on this rank is ",
           c10::IntArrayRef(want));
  if (local.is_meta()) return at::empty(src.with_placements(dst).local_shape(), local.options());
  auto plan = plan_redistribute(src, dst);
  if (plan->steps.empty()) return local.contiguous();
  const auto& mesh = src.mesh();
  const auto mesh_shape = mesh.shape();
  const auto coord = src.coordinate();
  at::Tensor cur = local;
  for (const auto& step : plan->steps) {
    Placements parent = step.before;
    parent[step.mesh_dim] = Replicate{};
    const auto parent_ranges = local_ranges(src.shape(), mesh_shape, coord, parent);
    StepContext ctx{mesh.get_group(step.mesh_dim), mesh_shape[step.mesh_dim], coord[step.mesh_dim],
                    [parent_ranges](int64_t d) { return total_size(parent_ranges[d]); },
                    tag.empty()
                        ? "redistribute " + to_string(src.placements()) + " -> " + to_string(dst)
                        : tag};
    cur = step.transition->apply(cur, step.from, step.to, ctx);
  }
  return cur.is_contiguous() ? cur : cur.contiguous();
}

}  // namespace

Placements normalized_for_grad(const Placements& p) {
  Placements out;
  for (const auto& x : p) out.push_back(grad_placement_of(x));
  return out;
}

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src,
                              const Placements& dst,
                              const std::optional<Placements>& grad_placements,
                              const std::string& tag) {
  const Placements gp = grad_placements ? *grad_placements : normalized_for_grad(dst);
  HP_CHECK(gp.size() == dst.size(), "redistribute: ", gp.size(), " grad placements for ",
           dst.size(), " mesh dims");
  const DTensorSpec grad_spec = src.with_placements(gp);
  const Placements grad_target = normalized_for_grad(src.placements());
  // The gradient's communication counts under the scope that issued the forward
  // (comm/traffic.h), wherever autograd runs it.
  std::string scope = comm::TrafficScope::current();
  return differentiable(
      local, [&](const at::Tensor& x) { return run_plan(x, src, dst, tag); },
      [grad_spec, grad_target, tag, scope](const at::Tensor& g) {
        at::NoGradGuard no_grad;
        comm::TrafficScope traffic(scope);
        return run_plan(g.contiguous(), grad_spec, grad_target, tag.empty() ? "" : tag + " (grad)");
      },
      "redistribute");
}

}  // namespace hyperpar::dtensor
