#include "hyperpar/nn/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hyperpar/core/error.h"

namespace hyperpar::nn {

namespace {

thread_local int recompute_depth = 0;
thread_local bool input_grads_only = false;

struct FnHolder : torch::CustomClassHolder {
  CheckpointFn fn;
  std::string name;
};

struct RecomputeScope {
  RecomputeScope() { ++recompute_depth; }
  ~RecomputeScope() { --recompute_depth; }
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                c10::intrusive_ptr<FnHolder> holder) {
    // Autograd is off inside a custom Function's forward: nothing of fn is recorded.
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    at::Tensor y = holder->fn(in);
    ctx->save_for_backward(in);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(std::move(holder));
    return {y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> in;
    std::vector<at::Tensor> wanted;  // inputs whose gradient autograd asks for
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor d = saved[i].detach();
      if (saved[i].requires_grad()) {
        d.requires_grad_(true);
        wanted.push_back(d);
      }
      in.push_back(d);
    }
    at::Tensor y;
    {
      at::AutoGradMode enable(true);
      RecomputeScope recomputing;
      y = holder->fn(in);
    }
    torch::autograd::variable_list out(saved.size() + 1);  // + the holder argument
    if (!y.requires_grad()) return out;
    if (input_grads_only) {
      if (wanted.empty()) return out;
      auto g = torch::autograd::grad({y}, wanted, {grads[0]}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t i = 0, w = 0; i < in.size(); ++i)
        if (in[i].requires_grad()) out[i] = g[w++];
      return out;
    }
    torch::autograd::backward({y}, {grads[0]});
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].requires_grad()) out[i] = in[i].grad();
    return out;
  }
};

}  // namespace

at::Tensor checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                      const char* name) {
  bool any_grad = false;
  for (const auto& t : inputs) any_grad = any_grad || t.requires_grad();
  if (!at::GradMode::is_enabled() || !any_grad || recompute_depth > 0) return fn(inputs);
  auto holder = c10::make_intrusive<FnHolder>();
  holder->fn = fn;
  holder->name = name;
  return CheckpointFunction::apply(at::TensorList(inputs), holder)[0];
}

bool is_recomputing() { return recompute_depth > 0; }

InputGradsOnly::InputGradsOnly() : previous_(input_grads_only) { input_grads_only = true; }
InputGradsOnly::~InputGradsOnly() { input_grads_only = previous_; }

}  // namespace hyperpar::nn
