#include "hyperpar/dtensor/differentiable.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

namespace hyperpar::dtensor {
namespace {

struct BackwardHolder : torch::CustomClassHolder {
  TensorFn backward;
};

struct LambdaFunction : public torch::autograd::Function<LambdaFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const TensorFn* fwd, const TensorFn* bwd) {
    auto holder = c10::make_intrusive<BackwardHolder>();
    holder->backward = *bwd;
    ctx->saved_data["backward"] = c10::IValue::make_capsule(std::move(holder));
    return (*fwd)(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder =
        c10::static_intrusive_pointer_cast<BackwardHolder>(ctx->saved_data["backward"].toCapsule());
    at::Tensor g = grads[0].defined() ? holder->backward(grads[0]) : at::Tensor();
    return {g, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor differentiable(const at::Tensor& x, const TensorFn& forward, TensorFn backward,
                          const char*) {
  if (!x.requires_grad() || !at::GradMode::is_enabled()) {
    at::NoGradGuard no_grad;
    return forward(x);
  }
  return LambdaFunction::apply(x, &forward, &backward);
}

}  // namespace hyperpar::dtensor
