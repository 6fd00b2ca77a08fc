#include "hyperpar/nn/shared_input_linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include <typeinfo>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/layers.h"

namespace hyperpar::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SharedInputLinearFunction : public torch::autograd::Function<SharedInputLinearFunction> {
  // inputs: x, then the weights.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs) {
    const at::Tensor& x = inputs[0];
    variable_list ys;
    for (size_t i = 1; i < inputs.size(); ++i) ys.push_back(at::matmul(x, inputs[i].t()));
    ctx->save_for_backward(inputs.vec());
    ctx->set_materialize_grads(false);  // an unused output: no GEMMs, and no weight gradient
    return ys;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const int64_t in = x.size(-1);
    const at::Tensor x2 = x.reshape({-1, in});
    variable_list out(saved.size());
    at::Tensor dx;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor& w = saved[i + 1];
      const at::Tensor g2 = grads[i].reshape({-1, w.size(0)});
      if (ctx->needs_input_grad(0)) {
        if (!dx.defined())
          dx = at::mm(g2, w);
        else
          dx.addmm_(g2, w);  // beta 1: the sum happens in the GEMM, not in a separate pass
      }
      if (ctx->needs_input_grad(i + 1)) out[i + 1] = at::mm(g2.t(), x2);  // [out, in], contiguous
    }
    if (dx.defined()) out[0] = dx.view(x.sizes());
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> linears_on_shared_input(const at::Tensor& x,
                                                const std::vector<at::Tensor>& weights) {
  HP_CHECK(!weights.empty(), "linears_on_shared_input: no weights");
  for (const auto& w : weights)
    HP_CHECK(w.dim() == 2 && w.size(1) == x.size(-1),
             "linears_on_shared_input: each weight must be [out, in] with in = the input's last "
             "dim ",
             x.size(-1), ", got ", w.sizes());
  std::vector<at::Tensor> inputs{x};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  return SharedInputLinearFunction::apply(at::TensorList(inputs));
}

std::vector<at::Tensor> call_linears_on_shared_input(const std::vector<Linear*>& modules,
                                                     const at::Tensor& x) {
  bool fusable = x.dim() >= 2;
  for (const Linear* m : modules)  // a subclass may compute something else in its forward
    fusable = fusable && typeid(*m) == typeid(Linear) && !m->has_param("bias") &&
              !m->reduce_output && !m->has_forward_pre_hooks() &&
              m->checkpoint_mode() != CheckpointMode::kWhole;
  std::vector<at::Tensor> out;
  if (!fusable) {
    for (Linear* m : modules) out.push_back((*m)(x));
    return out;
  }
  std::vector<at::Tensor> weights;
  for (const Linear* m : modules) weights.push_back(m->weight_for(x));
  out = linears_on_shared_input(x, weights);
  for (size_t i = 0; i < modules.size(); ++i) out[i] = modules[i]->run_forward_hooks(x, out[i]);
  return out;
}

}  // namespace hyperpar::nn
