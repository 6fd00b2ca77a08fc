// SwiGLU's pointwise part, silu(a) * b, as one fused autograd Function on float32 CPU tensors
// (nn/fused_ops.h). Composed, it is silu and mul forward (a temporary the size of the hidden
// activation, saved too) and mul, mul and silu_backward backward: five passes over
// [tokens, hidden], three temporaries, and exp and the divisions computed twice. Fused: one
// pass each way; the forward keeps sigmoid(a) (where the composite keeps silu(a): the same
// memory), so the backward is only multiplications and adds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hyperpar/core/error.h"
#include "hyperpar/nn/fused_ops.h"
#include "swiglu_kernels.h"

namespace hyperpar::nn {

namespace {

constexpr int64_t kGrain = 32768;  // elements per task: a few hundred KiB of each stream

struct SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a_in,
                            const at::Tensor& b_in) {
    const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
    at::Tensor out = at::empty_like(a), sig = at::empty_like(a);
    const float *ap = a.const_data_ptr<float>(), *bp = b.const_data_ptr<float>();
    float *op = out.data_ptr<float>(), *sp = sig.data_ptr<float>();
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t begin, int64_t end) {
      swiglu_kernels::forward_avx2(ap + begin, bp + begin, op + begin, sp + begin, end - begin);
    });
    ctx->save_for_backward({a, b, sig});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &sig = saved[2];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor da = at::empty_like(a), db = at::empty_like(b);
    const float *gp = g.const_data_ptr<float>(), *ap = a.const_data_ptr<float>(),
                *bp = b.const_data_ptr<float>(), *sp = sig.const_data_ptr<float>();
    float *dap = da.data_ptr<float>(), *dbp = db.data_ptr<float>();
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t begin, int64_t end) {
      swiglu_kernels::backward_avx2(gp + begin, ap + begin, bp + begin, sp + begin, dap + begin,
                                    dbp + begin, end - begin);
    });
    return {da, db};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b) {
  HP_CHECK(a.sizes() == b.sizes(), "swiglu: a ", a.sizes(), " and b ", b.sizes(),
           " must have the same shape");
  const bool fused = a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
                     a.device().is_cpu() && b.device().is_cpu() &&
                     swiglu_kernels::avx2_fma_available();
  if (!fused) return at::silu(a) * b;
  return SwiGluFunction::apply(a, b);
}

}  // namespace hyperpar::nn
