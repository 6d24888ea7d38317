// SPDX-License-Identifier: BSD-3-Clause
// conv_bench: forward + backward of a convolutional surrogate stack on the host, one BLAS thread,
// against the machine's measured FMA peak (its widest vectors). The stack (defaults): Input{1, 64,
// 64}, Conv2d(1, 32, 3).with_padding(1), ReLU, Conv2d(32, 32, 3).with_padding(1), ReLU, Conv2d(32,
// 1, 3).with_padding(1), MSE loss, batch 16: the shapes benchmarks/compare/conv_torch.py times in
// PyTorch. Prints the median step time and GFLOP/s (2 x multiply-adds of the convolutions, times 3
// for forward, input and weight gradients, per second of the process's CPU time) and the fraction
// of the peak. Two ranks: run two copies under mpiexec (each prints its own line). Usage:
// conv_bench [batch] [grid] [channels] [reps] [isa]; isa (avx512, avx2, portable) forces the direct
// kernel's instruction set (host::force_conv_isa): with `portable` the layers' automatic choice is
// the GEMM lowering (im2col or shifted views), so one binary times both paths.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/kernels/host/blas_exec.hpp>
#include <dtrain/model/model.hpp>

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_seconds() {
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
__attribute__((target("avx2,fma"))) double fma_peak_avx2() { return fma_chains<f32x8>(); }
__attribute__((target("avx512f"))) double fma_peak_avx512() { return fma_chains<f32x16>(); }
// The widest the CPU has: 16 lanes (AVX-512), else 8 (AVX2 + FMA), else 0.
double fma_peak_gflops(const char** isa) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return *isa = "AVX-512", fma_peak_avx512();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return *isa = "AVX2", fma_peak_avx2();
  return *isa = "none", 0.0;
}
}  // namespace

int main(int argc, char** argv) {
  const std::int64_t batch = argc > 1 ? std::atoll(argv[1]) : 16;
  const std::int64_t grid = argc > 2 ? std::atoll(argv[2]) : 64;
  const std::int64_t ch = argc > 3 ? std::atoll(argv[3]) : 32;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 30;
  if (argc > 5) {
    const std::string isa = argv[5];
    for (auto v : {dtrain::host::ConvIsa::avx512, dtrain::host::ConvIsa::avx2,
                   dtrain::host::ConvIsa::portable})
      if (isa == dtrain::host::conv_isa_name(v)) dtrain::host::force_conv_isa(v);
    if (isa != dtrain::host::conv_isa_name(dtrain::host::conv_isa()))
      return std::fprintf(stderr, "conv_bench: unknown or unsupported isa %s\n", argv[5]), 2;
  }
  dtrain::blas::apply_threads(1);  // one BLAS thread per process
  dtrain::HostBlasExec exec;       // GEMM through CBLAS
  dtrain::BasicSequential<float, dtrain::HostBlasExec> model(
      {dtrain::Input{1, grid, grid}, dtrain::Conv2d(1, ch, 3).with_padding(1), dtrain::Relu{},
       dtrain::Conv2d(ch, ch, 3).with_padding(1), dtrain::Relu{},
       dtrain::Conv2d(ch, 1, 3).with_padding(1)},
      exec);
  model.init(1);
  dtrain::RngStream rng(2, 0);
  std::vector<float> x(static_cast<std::size_t>(batch * grid * grid)), y(x.size());
  for (auto& v : x) v = static_cast<float>(rng.normal());
  for (auto& v : y) v = static_cast<float>(rng.normal());
  std::vector<double> times, cpu;
  for (int i = 0; i < reps + 5; ++i) {
    const double t0 = seconds(), c0 = cpu_seconds();
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), batch, dtrain::Loss::mse);
    if (i >= 5) {
      times.push_back(seconds() - t0);
      cpu.push_back(cpu_seconds() - c0);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  const double ms = times[times.size() / 2] * 1e3, cpu_ms = cpu[cpu.size() / 2] * 1e3;
  const double macs = static_cast<double>(batch * grid * grid) * 9.0 * double(ch + ch * ch + ch);
  const double gflops = 2.0 * macs * 3.0 / (cpu_ms * 1e-3) / 1e9;  // per CPU second
  // The lowering of the middle convolution (all three choose alike on this stack).
  const char* lowerings[] = {"automatic", "im2col", "shifted", "direct"};
  const auto& mid =
      dynamic_cast<const dtrain::ConvLayer<float, dtrain::HostBlasExec>&>(model.layer(2));
  const auto lowering = lowerings[static_cast<int>(mid.lowering())];
  const char* isa = "";
  const double peak = fma_peak_gflops(&isa);
  std::printf(
      "dtrain conv stack batch=%lld grid=%lld channels=%lld (%s, %s): median %.2f ms/step (%.2f "
      "ms CPU), %.2f GFLOP/s of CPU time, %.0f%% of the measured %s FMA peak %.1f GFLOP/s\n",
      static_cast<long long>(batch), static_cast<long long>(grid), static_cast<long long>(ch),
      lowering, dtrain::host::conv_isa_name(mid.direct_isa()), ms, cpu_ms, gflops,
      100.0 * gflops / peak, isa, peak);
  return 0;
}
