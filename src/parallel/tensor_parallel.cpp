#include "hyperpar/parallel/tensor_parallel.h"

#include <ATen/ATen.h>

#include <sstream>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/differentiable.h"
#include "hyperpar/dtensor/redistribute/redistribute.h"
#include "hyperpar/nn/layers.h"
#include "hyperpar/nn/moe.h"

namespace hyperpar::parallel {

using namespace dtensor;

namespace {

Placement normalize(Placement p, int64_t ndim) {
  if (auto* s = std::get_if<Shard>(&p))
    if (s->dim < 0) s->dim += ndim;
  return p;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '.')) out.push_back(part);
  return out;
}

template <typename T>
T& expect(nn::Module& m, const std::string& fqn, const char* style) {
  auto* p = dynamic_cast<T*>(&m);
  HP_CHECK(p != nullptr, style, " cannot be applied to '", fqn, "' (a ", m.type_name(), ")");
  return *p;
}

void distribute(nn::Module& m, const std::string& name, const mesh::DeviceMesh& tp, Placement p) {
  if (m.has_param(name)) distribute_parameter(m.param(name), tp, {p});
}

// The gradient of a Replicate value used by sharded compute is a partial sum.
std::optional<Placement> grad_for(const Placement& desired) {
  if (is_replicate(desired)) return Placement{Partial{}};
  return std::nullopt;
}

}  // namespace

std::string tp_traffic_scope(const std::string& tag) {
  // The block a call site belongs to: "layers.3.attention.wo output" -> "tp layers.3",
  // "output input (grad)" -> "tp output".
  const std::string fqn = tag.substr(0, tag.find(' '));
  const auto parts = split(fqn);
  if (parts.empty()) return "tp";
  if (parts[0] == "layers" && parts.size() > 1) return "tp layers." + parts[1];
  return "tp " + parts[0];
}

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
  const auto p = split(pattern), f = split(fqn);
  if (p.size() != f.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != f[i]) return false;
  return true;
}

at::Tensor relayout(const at::Tensor& x, const mesh::DeviceMesh& tp, Placement from, Placement to,
                    std::optional<Placement> grad, const std::string& tag) {
  HP_CHECK(tp.ndim() == 1, "relayout: tensor parallel needs a 1-D mesh, got ", tp.to_string());
  from = normalize(from, x.dim());
  to = normalize(to, x.dim());
  if (grad) grad = normalize(*grad, x.dim());
  std::vector<int64_t> shape = x.sizes().vec();
  const int64_t n = tp.size();
  if (shard_dim(from) >= 0) shape[shard_dim(from)] *= n;
  if (shard_dim(to) >= 0)
    HP_CHECK(shape[shard_dim(to)] % n == 0, "tensor parallel: activation dim ", shard_dim(to),
             " of size ", shape[shard_dim(to)], " must be divisible by the tp size ", n,
             " to be sharded (", tag, ")");
  DTensorSpec spec(tp, {from}, shape);
  std::optional<Placements> gp;
  if (grad) gp = Placements{*grad};
  comm::TrafficScope traffic(tp_traffic_scope(tag));
  return redistribute_local(x, spec, {to}, gp, tag);
}

void ColwiseParallel::apply(nn::Module& m, const std::string& fqn,
                            const mesh::DeviceMesh& tp) const {
  const auto in = input_layout_;
  const auto out = output_layout_;
  if (auto* emb = dynamic_cast<nn::Embedding*>(&m)) {
    distribute(*emb, "weight", tp, Shard{1});
  } else {
    auto& lin = expect<nn::Linear>(m, fqn, "ColwiseParallel");
    distribute(lin, "weight", tp, Shard{0});
    distribute(lin, "bias", tp, Shard{0});
    if (in)
      m.add_forward_pre_hook([tp, in, fqn](nn::Module&, const at::Tensor& x) {
        return relayout(x, tp, *in, Replicate{}, Placement{Partial{}}, fqn + " input");
      });
  }
  m.add_forward_hook([tp, out, fqn](nn::Module&, const at::Tensor&, const at::Tensor& y) {
    const Placement o = normalize(out, y.dim());
    if (is_shard(o) && shard_dim(o) == y.dim() - 1) return y;
    return relayout(y, tp, Shard{-1}, o, std::nullopt, fqn + " output");
  });
}

void RowwiseParallel::apply(nn::Module& m, const std::string& fqn,
                            const mesh::DeviceMesh& tp) const {
  const auto out = output_layout_;
  auto reduce = [tp, out, fqn](const at::Tensor& y) {
    return relayout(y, tp, Partial{}, out, std::nullopt, fqn + " output");
  };
  if (auto* emb = dynamic_cast<nn::Embedding*>(&m)) {
    distribute(*emb, "weight", tp, Shard{0});
    const auto rows = emb->param("weight").local_ranges()[0];
    emb->vocab_start = rows.empty() ? 0 : rows[0].start;
    emb->reduce_output = reduce;
    return;
  }
  auto& lin = expect<nn::Linear>(m, fqn, "RowwiseParallel");
  distribute(lin, "weight", tp, Shard{1});
  distribute(lin, "bias", tp, Replicate{});
  lin.reduce_output = reduce;
  if (input_layout_) {
    const Placement in = *input_layout_;
    m.add_forward_pre_hook([tp, in, fqn](nn::Module&, const at::Tensor& x) {
      const Placement i = normalize(in, x.dim());
      if (is_shard(i) && shard_dim(i) == x.dim() - 1) return x;
      return relayout(x, tp, i, Shard{-1}, std::nullopt, fqn + " input");
    });
  }
}

void SequenceParallel::apply(nn::Module& m, const std::string& fqn,
                             const mesh::DeviceMesh& tp) const {
  auto& norm = expect<nn::RMSNorm>(m, fqn, "SequenceParallel");
  auto& w = norm.param("weight");
  distribute_parameter(w, tp, {Replicate{}});
  DTensorSpec spec = *w.spec;
  w.materialize = [spec, fqn](const at::Tensor& t) {
    comm::TrafficScope traffic(tp_traffic_scope(fqn));
    return redistribute_local(t, spec, {Replicate{}}, Placements{Partial{}}, fqn + ".weight");
  };
}

void PrepareModuleInput::apply(nn::Module& m, const std::string& fqn,
                               const mesh::DeviceMesh& tp) const {
  const Placement in = input_, want = desired_;
  m.add_forward_pre_hook([tp, in, want, fqn](nn::Module&, const at::Tensor& x) {
    return relayout(x, tp, in, want, grad_for(want), fqn + " input");
  });
}

void PrepareModuleOutput::apply(nn::Module& m, const std::string& fqn,
                                const mesh::DeviceMesh& tp) const {
  const Placement out = output_, want = desired_;
  m.add_forward_hook([tp, out, want, fqn](nn::Module&, const at::Tensor&, const at::Tensor& y) {
    return relayout(y, tp, out, want, std::nullopt, fqn + " output");
  });
}

void install_expert_tp_hooks(nn::MoE& moe, const mesh::DeviceMesh& tp, const std::string& fqn,
                             bool input_grad_partial) {
  moe.experts->reduce_output = [tp, fqn](const at::Tensor& y) {
    return relayout(y, tp, Partial{}, Replicate{}, std::nullopt, fqn + ".experts output");
  };
  moe.prepare_routing_weights = [tp, fqn](const at::Tensor& w) {
    return relayout(w, tp, Replicate{}, Replicate{}, Placement{Partial{}},
                    fqn + " routing weights");
  };
  if (!input_grad_partial) {
    // The experts' input gradient is a partial sum over tp: all-reduce it.
    moe.prepare_expert_input = [tp, fqn](const at::Tensor& x) {
      return relayout(x, tp, Replicate{}, Replicate{}, Placement{Partial{}},
                      fqn + ".experts input");
    };
    return;
  }
  count_router_grad_once(moe, tp);
}

void count_router_grad_once(nn::MoE& moe, const mesh::DeviceMesh& tp) {
  // The layer's input gradient is treated as a partial sum (a PrepareModuleInput with a
  // Partial gradient, as in sequence parallel). The router's share of it is the same on
  // every tp rank (replicated compute): count it once.
  const int64_t coord = tp.get_local_rank(0);
  moe.prepare_router_input = [coord](const at::Tensor& x) {
    return differentiable(
        x, [](const at::Tensor& t) { return t; },
        [coord](const at::Tensor& g) { return coord == 0 ? g : at::zeros_like(g); },
        "replicate_grad_as_partial");
  };
}

void MoETensorParallel::apply(nn::Module& m, const std::string& fqn,
                              const mesh::DeviceMesh& tp) const {
  auto& moe = expect<nn::MoE>(m, fqn, "MoETensorParallel");
  auto& ex = *moe.experts;
  distribute(ex, "w1", tp, Shard{1});
  distribute(ex, "w3", tp, Shard{1});
  distribute(ex, "w2", tp, Shard{2});
  install_expert_tp_hooks(moe, tp, fqn, input_grad_partial_);
}

void apply_plan(nn::Module& root, const mesh::DeviceMesh& mesh, const ParallelizePlan& plan) {
  auto modules = root.named_modules();
  for (const auto& [pattern, style] : plan) {
    int hits = 0;
    for (auto& [fqn, m] : modules)
      if (fqn_matches(pattern, fqn)) {
        style->apply(*m, fqn, mesh);
        ++hits;
      }
    HP_CHECK(hits > 0, "parallelize_module: pattern '", pattern, "' (", style->name(),
             ") matches no module");
  }
}

void parallelize_module(nn::Module& root, const mesh::DeviceMesh& tp, const ParallelizePlan& plan) {
  HP_CHECK(tp.ndim() == 1, "parallelize_module: the tp mesh must be 1-D, got ", tp.to_string());
  apply_plan(root, tp, plan);
  for (auto& [fqn, p] : root.named_parameters())
    if (!p->is_distributed()) distribute_parameter(*p, tp, {Replicate{}});
}

}  // namespace hyperpar::parallel
