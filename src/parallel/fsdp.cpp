#include "hyperpar/parallel/fsdp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <numeric>

#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/dtensor/dtensor_spec.h"

namespace hyperpar::parallel {

using namespace dtensor;

class FSDPGroup : public std::enable_shared_from_this<FSDPGroup> {
 public:
  std::vector<nn::Parameter*> params;
  std::vector<std::string> fqns;
  std::vector<std::vector<int64_t>> full_local;      // TP-local (unsharded by FSDP) shape
  std::vector<int64_t> row_numel, max_rows, offset;  // per param; offset into a rank segment
  int64_t segment = 0;                               // padded elements per rank
  std::shared_ptr<comm::Communicator> shard_group, replicate_group;
  std::optional<mesh::DeviceMesh> dp_mesh;  // groups are fetched at first use (dry runs never)
  int64_t dp = 1, coord = 0;

  std::shared_ptr<comm::Communicator> reshard_group;  // post-forward group (reshard_to)

  // Ranks that share a post-forward shard: reshard_to consecutive shard coordinates.
  int64_t post_forward_size() const { return opts.reshard_to > 0 ? opts.reshard_to : dp; }

  void ensure_groups() {
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
  FSDPOptions opts;
  std::string tag;
  std::vector<at::Tensor> unsharded;
  std::vector<at::Tensor> grad_acc;
  bool sync = true, freed = false;
  FSDPStats stats;

  int64_t rows(size_t i, int64_t r) const { return chunk_range(full_local[i][0], dp, r).size; }

  // A prefetched all-gather in flight: its buffers and the shards' versions when issued.
  struct PendingGather {
    comm::WorkHandle work;
    at::Tensor send, recv;
    std::vector<int64_t> versions;
    bool from_kept;
  };
  // With reshard_to = k < dp: after forward this rank keeps the padded segments of dp / k
  // shard ranks (its position j = coord % k picks segments [j * dp/k, (j+1) * dp/k)), so
  // the k ranks of its post-forward group hold the whole flat buffer between them.
  at::Tensor kept;
  std::optional<PendingGather> pending;
  std::vector<std::weak_ptr<FSDPGroup>> forward_prefetch, backward_prefetch;

  std::vector<int64_t> shard_versions() const {
    std::vector<int64_t> v;
    for (auto* p : params) v.push_back(static_cast<int64_t>(p->data._version()));
    return v;
  }

  // Issues the flat all-gather without waiting: of every shard (padded, cast to
  // param_dtype) over the shard group, or of the post-forward chunks over the reshard group.
  void begin_gather(bool from_kept = false) {
    if (pending) return;
    auto opts_t = at::TensorOptions().dtype(opts.param_dtype);
    at::Tensor send;
    ensure_groups();
    auto group = shard_group;
    if (from_kept) {
      send = kept;
      group = reshard_group;
    } else {
      send = at::zeros({segment}, opts_t);
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& shard = params[i]->data;
        if (shard.numel() > 0)
          send.narrow(0, offset[i], shard.numel()).copy_(shard.detach().reshape({-1}));
      }
    }
    at::Tensor recv = at::empty({dp * segment}, opts_t);
    auto work = group->all_gather_into_tensor(recv, send, {tag, true});
    ++stats.all_gathers;
    if (from_kept) ++stats.post_forward_group_gathers;
    pending = PendingGather{work, send, recv, shard_versions(), from_kept};
  }

  // The gathered [dp * segment] buffer: the prefetched one if it is still current (no shard
  // changed since it was issued, e.g. by an optimizer step), else a fresh all-gather.
  at::Tensor gather_flat(bool from_kept = false) {
    if (pending) {
      pending->work->wait();
      if (pending->versions == shard_versions() && pending->from_kept == from_kept)
        ++stats.prefetched;
      else
        pending.reset();  // stale: a shard was updated after it was issued
    }
    if (!pending) begin_gather(from_kept);
    pending->work->wait();
    at::Tensor flat = pending->recv;
    pending.reset();
    return flat;
  }

  void prefetch(const std::vector<std::weak_ptr<FSDPGroup>>& targets, bool only_freed) {
    for (const auto& w : targets)
      if (auto t = w.lock())
        if (!only_freed || t->freed) t->begin_gather(only_freed && t->kept.defined());
  }

  // Rank r's rows of param i inside the gathered buffer, concatenated over ranks.
  void copy_out(const at::Tensor& flat, size_t i, at::Tensor dst) {
    int64_t row = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const int64_t n = rows(i, r);
      if (n == 0) continue;
      dst.narrow(0, row, n).view({-1}).copy_(
          flat.narrow(0, r * segment + offset[i], n * row_numel[i]));
      row += n;
    }
  }

  std::vector<at::Tensor> unshard_new() {
    at::Tensor flat = gather_flat();
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor t = at::empty(full_local[i], at::TensorOptions().dtype(opts.param_dtype));
      copy_out(flat, i, t);
      out.push_back(t);
    }
    return out;
  }

  // Rows of param i that shard rank r holds start at this row of the unsharded tensor.
  int64_t first_row(size_t i, int64_t r) const {
    int64_t row = 0;
    for (int64_t q = 0; q < r; ++q) row += rows(i, q);
    return row;
  }

  void free_unsharded() {
    const int64_t k = post_forward_size();
    if (k < dp) {
      const int64_t per = dp / k, j = coord % k;
      kept = at::zeros({per * segment}, at::TensorOptions().dtype(opts.param_dtype));
      for (int64_t r = j * per; r < (j + 1) * per; ++r)
        for (size_t i = 0; i < params.size(); ++i) {
          const int64_t n = rows(i, r);
          if (n == 0) continue;
          kept.narrow(0, (r - j * per) * segment + offset[i], n * row_numel[i])
              .copy_(unsharded[i].detach().narrow(0, first_row(i, r), n).reshape({-1}));
        }
    }
    for (auto& t : unsharded) at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), 0);
    freed = true;
  }

  // Refill freed storage in place (saved tensors alias it); written through a fresh alias
  // so the autograd version counter is untouched.
  void refill() {
    if (!freed) return;
    at::Tensor flat = gather_flat(kept.defined());
    kept = at::Tensor();
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& t = unsharded[i];
      at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(),
                                   t.numel() * t.element_size());
      at::Tensor alias = at::from_blob(t.data_ptr(), t.sizes(), t.options());
      copy_out(flat, i, alias);
    }
    freed = false;
  }

  // The single gradient-reduction entry point: grads (any layout) -> sharded grads.
  std::vector<at::Tensor> reduce_grads(const std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> full(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (grads[i].defined() && !grads[i].is_contiguous()) ++stats.noncontiguous_grads;
      full[i] = grads[i].defined()
                    ? grads[i].to(opts.reduce_dtype)
                    : at::zeros(full_local[i], at::TensorOptions().dtype(opts.reduce_dtype));
      if (!grad_acc.empty() && grad_acc[i].defined()) full[i] = full[i] + grad_acc[i];
    }
    std::vector<at::Tensor> out(params.size());
    if (!sync) {
      grad_acc = full;  // unreduced running sum; sharded grads stay untouched
      return out;
    }
    grad_acc.clear();
    auto ropt = at::TensorOptions().dtype(opts.reduce_dtype);
    // Copy-in: rank r's rows of every parameter at r * segment + offset (contiguous, padded).
    at::Tensor send = at::zeros({dp * segment}, ropt);
    for (size_t i = 0; i < params.size(); ++i) {
      int64_t row = 0;
      for (int64_t r = 0; r < dp; ++r) {
        const int64_t n = rows(i, r);
        if (n == 0) continue;
        send.narrow(0, r * segment + offset[i], n * row_numel[i])
            .copy_(full[i].narrow(0, row, n).reshape({-1}));
        row += n;
      }
    }
    at::Tensor recv = at::empty({segment}, ropt);
    ensure_groups();
    finish_all_reductions();  // at most one reduce-scatter in flight (bounds memory)
    auto work = shard_group->reduce_scatter_tensor(recv, send, reduce_op(), {tag, true});
    ++stats.reduce_scatters;
    pending_reduce = PendingReduce{work, send, recv};
    in_flight().push_back(shared_from_this());
    // Whatever is still in flight when this backward ends is finished then (FSDP2's
    // post-backward callback), so the optimizer always sees complete gradients.
    torch::autograd::Engine::get_default_engine().queue_callback([] { finish_all_reductions(); });
    return out;  // undefined: finish_reduce writes the sharded gradients itself
  }

  comm::ReduceOp reduce_op() const {
    return opts.gradient_divide_factor ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  }

  // An issued reduce-scatter: waited on when the next group reduces or backward ends; then
  // the HSDP all-reduce, the divide factor, and the sharded gradients written (added to any
  // gradient already there, as autograd accumulation would).
  struct PendingReduce {
    comm::WorkHandle work;
    at::Tensor send, recv;
  };
  std::optional<PendingReduce> pending_reduce;

  void finish_reduce() {
    if (!pending_reduce) return;
    PendingReduce pr = std::move(*pending_reduce);
    pending_reduce.reset();
    pr.work->wait();
    if (replicate_group) {
      replicate_group->all_reduce(pr.recv, reduce_op(), {tag, false});
      ++stats.all_reduces;
    }
    if (opts.gradient_divide_factor) pr.recv.div_(*opts.gradient_divide_factor);
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& shard = params[i]->data;
      at::Tensor g = pr.recv.narrow(0, offset[i], shard.numel())
                         .view(shard.sizes())
                         .to(shard.scalar_type())
                         .clone();
      at::Tensor& grad = shard.mutable_grad();
      if (grad.defined())
        grad.add_(g);
      else
        grad = g;
    }
  }

  // Groups with a reduce-scatter in flight, in issue order (one backward thread: CPU autograd
  // runs on the caller's thread, so does the end-of-backward callback).
  static std::vector<std::weak_ptr<FSDPGroup>>& in_flight() {
    static std::vector<std::weak_ptr<FSDPGroup>> groups;
    return groups;
  }
  static void finish_all_reductions() {
    auto groups = std::move(in_flight());
    in_flight().clear();
    for (auto& w : groups)
      if (auto g = w.lock()) g->finish_reduce();
  }
};

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
    group->unsharded.clear();     // the next forward unshards again
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
  bool any_meta = false;
  for (auto& [fqn, p] : module.named_parameters(prefix)) {
    if (p->fsdp_managed) continue;
    HP_CHECK(!p->shape.empty(), "fully_shard: parameter ", fqn, " is a scalar; FSDP shards dim 0");
    Placement fsdp_p = Shard{0};
    Placements placements;
    if (dp_mesh.ndim() == 2) placements.push_back(Replicate{});
    mesh::DeviceMesh combined = dp_mesh;
    std::vector<int64_t> tp_local = p->data.sizes().vec();
    if (p->spec) {
      const auto& tp_mesh = p->spec->mesh();
      int64_t dim0_split = 1;
      for (size_t d = 0; d < p->spec->placements().size(); ++d) {
        const auto& tpp = p->spec->placements()[d];
        if (shard_dim(tpp) != 0) continue;
        HP_CHECK(is_shard(tpp), "fully_shard: ", fqn, " is sharded on dim 0 as ",
                 p->placements_string(), "; only Shard(0) composes with FSDP's dim 0");
        dim0_split *= tp_mesh.size(static_cast<int64_t>(d));
      }
      if (dim0_split > 1) {
        HP_CHECK(p->shape[0] % dim0_split == 0, "fully_shard: ", fqn, " dim 0 (", p->shape[0],
                 ") must divide by the ", dim0_split, " TP/EP shards of it (",
                 p->placements_string(), " on ", tp_mesh.to_string(), ") to compose with FSDP");
        fsdp_p = StridedShard{0, dim0_split};
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
      } else {
        const IndexRange rr = chunk_range(tp_local[0], g->dp, g->coord);
        shard = p->data.narrow(0, rr.start, rr.size).clone();
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
    for (size_t d = 1; d < tp_local.size(); ++d) rn *= tp_local[d];
    g->row_numel.push_back(rn);
    g->max_rows.push_back(max_chunk_size(tp_local[0], g->dp));
    g->offset.push_back(g->segment);
    g->segment += g->max_rows.back() * rn;
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
  (void)any_meta;
  if (g->params.empty()) return FSDPHandle(g);
  g->dp_mesh = dp_mesh;
  module.add_forward_pre_hook([g](nn::Module& m, const at::Tensor& x) {
    // Before any communication: a parameter left on meta (no to_empty) is named here, at
    // the call site, not found later by a collective (the root's check covers the model).
    nn::check_materialized(m, "forward of " + m.type_name());
    std::vector<at::Tensor> shards;
    for (auto* p : g->params) shards.push_back(p->data);
    g->unsharded = UnshardFunction::apply(at::TensorList(shards), g);
    g->freed = false;
    if (at::GradMode::is_enabled()) g->prefetch(g->forward_prefetch, false);
    return x;
  });
  module.add_forward_hook([g](nn::Module&, const at::Tensor&, const at::Tensor& y) {
    if (!g->opts.reshard_after_forward || g->post_forward_size() == 1 || !y.requires_grad()) {
      if (!y.requires_grad()) g->unsharded.clear();
      return y;
    }
    g->free_unsharded();
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
