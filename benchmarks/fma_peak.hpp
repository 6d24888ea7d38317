// SPDX-License-Identifier: BSD-3-Clause
// The FMA peak of one core for the CPU benchmarks (conv_bench, model_bench): the figure their
// GFLOP/s are compared with. Not part of the library.
#pragma once

#include <time.h>

#include <cstdio>

namespace dtrain_bench {

inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Single-precision FMA throughput of one core, in CPU time (a busy machine lowers it less than
// wall time): 12 independent chains of W-lane FMAs, few enough to stay in registers without
// -march flags (16 chains plus two constants spill to the stack and halve the figure).
using f32x8 = float __attribute__((vector_size(32)));
using f32x16 = float __attribute__((vector_size(64)));
template <class vec>
__attribute__((always_inline)) inline double fma_chains() {  // compiled for the caller's target
  constexpr int W = sizeof(vec) / sizeof(float);
  vec acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = vec{} + 1e-3f * static_cast<float>(i);
  const vec a = vec{} + 0.999999f, b = vec{} + 1e-7f;
  const long iters = 20'000'000;
  const double t0 = cpu_seconds();
  for (long k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * a + b;
  const double t = cpu_seconds() - t0;
  float sink = 0;
  for (auto& v : acc)
    for (int j = 0; j < W; ++j) sink += v[j];
  if (sink == 12345.0f) std::printf(" ");
  return 2.0 * W * 12 * static_cast<double>(iters) / t / 1e9;
}
__attribute__((target("avx2,fma"))) inline double fma_peak_avx2() { return fma_chains<f32x8>(); }
__attribute__((target("avx512f"))) inline double fma_peak_avx512() { return fma_chains<f32x16>(); }
// The widest the CPU has: 16 lanes (AVX-512), else 8 (AVX2 + FMA), else 0.
inline double fma_peak_gflops(const char** isa) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return *isa = "AVX-512", fma_peak_avx512();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return *isa = "AVX2", fma_peak_avx2();
  return *isa = "none", 0.0;
}

}  // namespace dtrain_bench
