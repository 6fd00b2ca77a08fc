#include "hyperpar/optim/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include "hyperpar/core/error.h"

namespace hyperpar::optim {

void Optimizer::zero_grad() {
  for (auto* p : params_)
    if (p->data.grad().defined()) p->data.mutable_grad() = at::Tensor();
}

AdamW::AdamW(std::vector<nn::Parameter*> params, double lr, double wd, double b1, double b2,
             double eps)
    : Optimizer(std::move(params)), wd_(wd), b1_(b1), b2_(b2), eps_(eps) {
  lr_ = lr;
  for (auto* p : params_) {
    m_.push_back(at::zeros_like(p->data, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p->data, at::MemoryFormat::Contiguous));
  }
}

void AdamW::step() {
  at::NoGradGuard no_grad;
  ++t_;
  // One fused call per (device, dtype): the kernel wants every list on one device and dtype.
  struct Batch {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  std::map<std::tuple<int, int, int>, Batch> batches;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i]->data;
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g.to(p.scalar_type()).contiguous();
    if (!p.is_contiguous()) {
      const double c1 = 1.0 - std::pow(b1_, static_cast<double>(t_));
      const double c2 = 1.0 - std::pow(b2_, static_cast<double>(t_));
      m_[i].mul_(b1_).add_(g, 1.0 - b1_);
      v_[i].mul_(b2_).addcmul_(g, g, 1.0 - b2_);
      p.mul_(1.0 - lr_ * wd_);
      p.addcdiv_(m_[i], (v_[i].sqrt() / std::sqrt(c2)).add_(eps_), -lr_ / c1);
      continue;
    }
    Batch& b = batches[{static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
                        p.device().index()}];
    b.params.push_back(p);
    b.grads.push_back(g);
    b.exp_avgs.push_back(m_[i]);
    b.exp_avg_sqs.push_back(v_[i]);
  }
  for (auto& [key, b] : batches) {
    // The kernel reads the step count from a float tensor per parameter; one serves all.
    const at::Tensor count =
        at::full({}, static_cast<double>(t_), b.params.front().options().dtype(at::kFloat));
    const std::vector<at::Tensor> steps(b.params.size(), count);
    at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, {}, steps, lr_, b1_, b2_, wd_,
                      eps_, /*amsgrad=*/false, /*maximize=*/false);
    // The fused kernel, called from C++, leaves the parameters' version counters as they
    // were; code that tells a changed shard by its version (FSDP's prefetch check and its
    // host-shared parameters, parallel/fsdp.h) must see the update, as after any in-place op.
    for (auto& p : b.params) p.unsafeGetTensorImpl()->bump_version();
  }
}

std::vector<Optimizer::StateTensor> AdamW::state_tensors() {
  std::vector<StateTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"exp_avg", i, m_[i]});
    out.push_back({"exp_avg_sq", i, v_[i]});
  }
  return out;
}

std::vector<Optimizer::StateTensor> SGD::state_tensors() {
  std::vector<StateTensor> out;
  if (momentum_ == 0) return out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!buf_[i].defined())
      buf_[i] = at::zeros_like(params_[i]->data, at::MemoryFormat::Contiguous);
    out.push_back({"momentum_buffer", i, buf_[i]});
  }
  return out;
}

SGD::SGD(std::vector<nn::Parameter*> params, double lr, double momentum, double wd)
    : Optimizer(std::move(params)), momentum_(momentum), wd_(wd) {
  lr_ = lr;
  buf_.resize(params_.size());
}

void SGD::step() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i]->data;
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g.to(p.scalar_type());
    if (wd_ != 0) g = g + wd_ * p;
    if (momentum_ != 0) {
      if (!buf_[i].defined())
        buf_[i] = g.clone();
      else
        buf_[i].mul_(momentum_).add_(g);  // a zero buffer (from state_tensors) gives g too
      g = buf_[i];
    }
    p.add_(g, -lr_);
  }
}

double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm,
                      comm::World& world, int64_t pp) {
  at::NoGradGuard no_grad;
  const double holders = static_cast<double>(world.size() / pp);
  // Gradients grouped by how many distinct shards their parameter has across the world; one
  // fused norm kernel (_foreach_norm) per group, summed in double, one host read in all.
  std::map<int64_t, std::vector<at::Tensor>> by_distinct;
  std::vector<at::Tensor> all;
  for (auto* p : params) {
    at::Tensor g = p->data.grad();
    if (!g.defined()) continue;
    int64_t distinct = 1;
    if (p->spec) {
      const auto ms = p->spec->mesh().shape();
      for (size_t d = 0; d < ms.size(); ++d)
        if (dtensor::shard_dim(p->spec->placements()[d]) >= 0) distinct *= ms[d];
    }
    by_distinct[distinct].push_back(g);
    all.push_back(g);
  }
  at::Tensor local = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
  for (const auto& [distinct, grads] : by_distinct) {
    const at::Tensor sq = at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).pow(2).sum();
    local.add_(sq * (static_cast<double>(distinct) / holders));
  }
  if (world.size() > 1) {
    std::vector<int64_t> ranks(world.size());
    std::iota(ranks.begin(), ranks.end(), 0);
    world.group(ranks, "world")->all_reduce(local, comm::ReduceOp::kSum, {"clip_grad_norm"});
  }
  const double norm = std::sqrt(local.item<double>());
  if (max_norm > 0 && norm > max_norm && !all.empty())
    at::_foreach_mul_(all, max_norm / (norm + 1e-6));
  return norm;
}

}  // namespace hyperpar::optim
