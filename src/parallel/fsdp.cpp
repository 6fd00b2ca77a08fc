#include "hyperpar/parallel/fsdp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <numeric>

#include "fsdp_group.h"
#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/dtensor/dtensor_spec.h"

namespace hyperpar::parallel {

using namespace dtensor;

namespace {

// Weak: the unsharded outputs' grad_fn must not keep the group (and its tensors) alive.
struct GroupHolder : torch::CustomClassHolder {
  std::weak_ptr<FSDPGroup> group;
};

// Shards -> unsharded tensors; backward: the group's reduce-scatter.
struct UnshardFunction : public torch::autograd::Function<UnshardFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList /*shards*/,
                                                std::shared_ptr<FSDPGroup> group) {
    auto h = c10::make_intrusive<GroupHolder>();
    h->group = group;
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(h));
    return group->unshard_new();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto h = c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
    auto group = h->group.lock();
    HP_CHECK(group, "FSDP: the parameter group was destroyed before backward");
    auto out = group->reduce_grads(grads);
    group->drop_unsharded();      // the next forward unshards again
    out.push_back(at::Tensor());  // for the group argument
    return out;
  }
};

}  // namespace

void FSDPHandle::set_requires_gradient_sync(bool sync) { group_->sync = sync; }
void FSDPHandle::set_modules_to_forward_prefetch(const std::vector<FSDPHandle>& next) {
  group_->forward_prefetch.clear();
  for (const auto& h : next) group_->forward_prefetch.push_back(h.group_);
}
void FSDPHandle::set_modules_to_backward_prefetch(const std::vector<FSDPHandle>& next) {
  group_->backward_prefetch.clear();
  for (const auto& h : next) group_->backward_prefetch.push_back(h.group_);
}
const FSDPStats& FSDPHandle::stats() const { return group_->stats; }
void FSDPHandle::reset_stats() { group_->stats = {}; }
const std::vector<std::string>& FSDPHandle::fqns() const { return group_->fqns; }
void FSDPHandle::unshard() { group_->hold(); }
void FSDPHandle::reduce_grad() { group_->reduce_held(); }
void FSDPHandle::reshard() { group_->release_held(); }
FSDPTrafficBound FSDPHandle::traffic_lower_bound(int64_t forwards, bool explicit_unshard) const {
  const FSDPGroup& g = *group_;
  FSDPTrafficBound out{g.traffic_scope, {}};
  if (g.trivial || g.params.empty()) return out;
  double psi = 0;
  for (const auto& shape : g.full_local) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    psi += n;
  }
  const double n = static_cast<double>(g.dp), k = static_cast<double>(g.post_forward_size());
  const double b_param = static_cast<double>(c10::elementSize(g.opts.param_dtype));
  const double b_reduce = static_cast<double>(c10::elementSize(g.opts.reduce_dtype));
  double gathers = (n - 1) / n * psi * b_param;
  if (!explicit_unshard) {
    const double refill = g.opts.reshard_after_forward ? (k - 1) / k * psi * b_param : 0.0;
    gathers = static_cast<double>(forwards) * (gathers + refill);
  }
  out.bytes_per_op.push_back({"all_gather_into_tensor", gathers});
  out.bytes_per_op.push_back({"reduce_scatter_tensor", (n - 1) / n * psi * b_reduce});
  if (g.dp_mesh && g.dp_mesh->ndim() == 2 && g.dp_mesh->size(0) > 1) {
    const double r = static_cast<double>(g.dp_mesh->size(0));
    out.bytes_per_op.push_back({"all_reduce", 2 * (r - 1) / r * psi / n * b_reduce});
  }
  return out;
}

void wait_gradient_reductions() { FSDPGroup::finish_all_reductions(); }

int64_t least_padded_dim(const std::vector<int64_t>& shape, int64_t n) {
  HP_CHECK(!shape.empty() && n >= 1, "least_padded_dim: expected a shape and n >= 1, got ",
           shape.size(), " dims over ", n);
  if (shape[0] % n == 0) return 0;
  int64_t best = 0;
  double best_size = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    double size = static_cast<double>(max_chunk_size(shape[d], n) * n);
    for (size_t o = 0; o < shape.size(); ++o)
      if (o != d) size *= static_cast<double>(shape[o]);
    if (d == 0 || size < best_size) {
      best = static_cast<int64_t>(d);
      best_size = size;
    }
  }
  return best;
}

FSDPHandle fully_shard(nn::Module& module, const mesh::DeviceMesh& dp_mesh, const FSDPOptions& opts,
                       const std::string& prefix) {
  HP_CHECK(dp_mesh.ndim() == 1 || dp_mesh.ndim() == 2,
           "fully_shard: the data-parallel mesh must be "
           "1-D (shard) or 2-D (replicate, shard), got ",
           dp_mesh.to_string());
  auto g = std::make_shared<FSDPGroup>();
  g->opts = opts;
  const int64_t shard_dim_of_mesh = dp_mesh.ndim() - 1;
  g->dp = dp_mesh.size(shard_dim_of_mesh);
  HP_CHECK(opts.reshard_to >= 0 && (opts.reshard_to == 0 || g->dp % opts.reshard_to == 0),
           "fully_shard: reshard_after_forward to ", opts.reshard_to,
           " ranks must divide the shard group size ", g->dp, " (or be 0: the whole group)");
  g->coord = dp_mesh.get_local_rank(shard_dim_of_mesh);
  // One shard rank, no replication, fp32 throughout, no divide factor: every collective
  // would be a copy of the rank's own data, so the group keeps its parameters as they are
  // (leaves that autograd accumulates into) and installs no hook: specs are still set.
  g->trivial = g->dp == 1 && (dp_mesh.ndim() == 1 || dp_mesh.size(0) == 1) &&
               opts.param_dtype == c10::kFloat && opts.reduce_dtype == c10::kFloat &&
               (!opts.gradient_divide_factor || *opts.gradient_divide_factor == 1.0);
  bool any_meta = false;
  for (auto& [fqn, p] : module.named_parameters(prefix)) {
    if (p->fsdp_managed) continue;
    HP_CHECK(!p->shape.empty(), "fully_shard: parameter ", fqn,
             " is a scalar; FSDP shards one of its dims");
    int64_t dim = 0;
    if (opts.shard_placement_fn)
      if (auto d = opts.shard_placement_fn(fqn, *p)) dim = *d;
    HP_CHECK(dim >= 0 && dim < static_cast<int64_t>(p->shape.size()),
             "fully_shard: shard_placement_fn chose dim ", dim, " for ", fqn, ", which has ",
             p->shape.size(), " dims (expected 0..", p->shape.size() - 1, ")");
    Placement fsdp_p = Shard{dim};
    Placements placements;
    if (dp_mesh.ndim() == 2) placements.push_back(Replicate{});
    mesh::DeviceMesh combined = dp_mesh;
    std::vector<int64_t> tp_local = p->data.sizes().vec();
    if (p->spec) {
      const auto& tp_mesh = p->spec->mesh();
      int64_t split = 1;  // TP/EP shards of the dim FSDP shards too
      for (size_t d = 0; d < p->spec->placements().size(); ++d) {
        const auto& tpp = p->spec->placements()[d];
        if (shard_dim(tpp) != dim) continue;
        HP_CHECK(is_shard(tpp), "fully_shard: ", fqn, " is sharded on dim ", dim, " as ",
                 p->placements_string(), "; only Shard(", dim, ") composes with FSDP's dim ", dim);
        split *= tp_mesh.size(static_cast<int64_t>(d));
      }
      if (split > 1) {
        HP_CHECK(p->shape[dim] % split == 0, "fully_shard: ", fqn, " dim ", dim, " (",
                 p->shape[dim], ") must divide by the ", split, " TP/EP shards of it (",
                 p->placements_string(), " on ", tp_mesh.to_string(), ") to compose with FSDP");
        fsdp_p = StridedShard{dim, split};
      }
      combined = mesh::concatenate({dp_mesh, tp_mesh});
    }
    placements.push_back(fsdp_p);
    if (p->spec)
      for (const auto& tpp : p->spec->placements()) placements.push_back(tpp);
    DTensorSpec spec(combined, placements, p->shape);
    const auto local_shape = spec.local_shape();
    at::Tensor shard;
    {
      at::NoGradGuard no_grad;
      if (p->data.is_meta()) {
        any_meta = true;
        shard = at::empty(local_shape, p->data.options());
      } else if (g->trivial) {
        shard = p->data;
      } else {
        const IndexRange rr = chunk_range(tp_local[dim], g->dp, g->coord);
        shard = p->data.narrow(dim, rr.start, rr.size).clone(at::MemoryFormat::Contiguous);
      }
    }
    p->data = shard.detach().requires_grad_(true);
    p->spec = spec;
    p->fsdp_managed = true;
    const size_t idx = g->params.size();
    g->params.push_back(p);
    g->fqns.push_back(fqn);
    g->full_local.push_back(tp_local);
    int64_t rn = 1;
    for (size_t d = 0; d < tp_local.size(); ++d)
      if (static_cast<int64_t>(d) != dim) rn *= tp_local[d];
    g->dim.push_back(dim);
    g->row_numel.push_back(rn);
    g->max_rows.push_back(max_chunk_size(tp_local[dim], g->dp));
    g->offset.push_back(g->segment);
    g->segment += g->max_rows.back() * rn;
    if (g->trivial) continue;
    auto old = p->materialize;
    std::weak_ptr<FSDPGroup> weak = g;
    p->materialize = [weak, idx, old, fqn](const at::Tensor&) {
      auto grp = weak.lock();
      HP_CHECK(grp && idx < grp->unsharded.size() && grp->unsharded[idx].defined(), "FSDP: ", fqn,
               " used outside its module's forward (it is sharded; unshard happens "
               "in the owning module's forward)");
      return old ? old(grp->unsharded[idx]) : grp->unsharded[idx];
    };
  }
  for (const auto& f : g->fqns) g->tag += (g->tag.empty() ? "" : ",") + f;
  g->tag = "fsdp[" + g->tag + "]";
  std::string module_name = prefix;
  if (!module_name.empty() && module_name.back() == '.') module_name.pop_back();
  g->traffic_scope = "fsdp " + (module_name.empty() ? std::string("(root)") : module_name);
  (void)any_meta;
  if (g->params.empty()) return FSDPHandle(g);
  g->dp_mesh = dp_mesh;
  if (g->trivial) return FSDPHandle(g);
  module.add_forward_pre_hook([g](nn::Module& m, const at::Tensor& x) {
    // Before any communication: a parameter left on meta (no to_empty) is named here, at
    // the call site, not found later by a collective (the root's check covers the model).
    nn::check_materialized(m, "forward of " + m.type_name());
    if (g->held) return x;  // explicitly unsharded: the held leaves serve every forward
    std::vector<at::Tensor> shards;
    for (auto* p : g->params) shards.push_back(p->data);
    g->unsharded = UnshardFunction::apply(at::TensorList(shards), g);
    g->freed = false;
    // Not while recomputing (activation checkpointing): no forward follows in backward.
    if (at::GradMode::is_enabled() && !nn::is_recomputing())
      g->prefetch(g->forward_prefetch, false);
    return x;
  });
  module.add_forward_hook([g](nn::Module&, const at::Tensor&, const at::Tensor& y) {
    if (g->held) return y;  // resharded by reshard(), not after each forward
    // A recomputation (activation checkpointing) runs inside backward: its backward comes
    // right after, so the unsharded parameters stay until the group's reduction clears them.
    if (nn::is_recomputing()) return y;
    if (!y.requires_grad()) {
      g->drop_unsharded();
      return y;
    }
    // Kept unsharded (no reshard after forward): nothing to refill, but its backward still
    // issues the backward prefetch of the next groups, as when it refills.
    const bool keep = !g->opts.reshard_after_forward || g->post_forward_size() == 1;
    if (!keep) g->free_unsharded();
    // Pre-backward: when the output's gradient arrives, refill before this module's backward.
    std::weak_ptr<FSDPGroup> weak = g;
    return differentiable(
        y, [](const at::Tensor& t) { return t; },
        [weak](const at::Tensor& grad) {
          if (auto grp = weak.lock()) {
            grp->refill();
            grp->prefetch(grp->backward_prefetch, true);
          }
          return grad;
        },
        "fsdp_pre_backward");
  });
  return FSDPHandle(g);
}

}  // namespace hyperpar::parallel
