// Built with -mavx2 -mfma and ATen's CPU_CAPABILITY=AVX2 (CMakeLists.txt): only ATen's vector
// headers are included here, so no other inline code is compiled for AVX2 and picked by the
// linker for machines without it; callers go through avx2_fma_available().
#include <ATen/cpu/vec/vec.h>

#include "swiglu_kernels.h"

namespace hyperpar::nn::swiglu_kernels {

namespace {
using V = at::vec::Vectorized<float>;
}  // namespace

bool avx2_fma_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

void forward_avx2(const float* a, const float* b, float* out, float* sig, int64_t n) {
  const V one(1.0f);
  for (int64_t i = 0; i < n; i += V::size()) {
    const int count = static_cast<int>(std::min<int64_t>(V::size(), n - i));
    const V x = V::loadu(a + i, count);
    const V s = one / (one + x.neg().exp());
    s.store(sig + i, count);
    (x * s * V::loadu(b + i, count)).store(out + i, count);
  }
}

void backward_avx2(const float* g, const float* a, const float* b, const float* sig, float* da,
                   float* db, int64_t n) {
  const V one(1.0f);
  for (int64_t i = 0; i < n; i += V::size()) {
    const int count = static_cast<int>(std::min<int64_t>(V::size(), n - i));
    const V x = V::loadu(a + i, count), gv = V::loadu(g + i, count), s = V::loadu(sig + i, count);
    (gv * V::loadu(b + i, count) * s * (one + x * (one - s))).store(da + i, count);
    (gv * (x * s)).store(db + i, count);
  }
}

}  // namespace hyperpar::nn::swiglu_kernels
