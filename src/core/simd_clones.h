#pragma once
// HP_SIMD_CLONES: compile a hot loop for AVX-512 and AVX2+FMA as well as the baseline, and
// pick one at load time (GCC function multiversioning, an ifunc): the build stays portable
// (no -march) while the fused kernels run vectorised on the machines that can.
// Loops written for it keep reductions in 16 independent lanes (float sums are not
// reassociated without -ffast-math, so a plain `sum += ...` would not vectorise).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HP_SIMD_CLONES
#endif

namespace hyperpar::simd {
constexpr int kLanes = 16;
}  // namespace hyperpar::simd
