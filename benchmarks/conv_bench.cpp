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
// the GEMM lowering (im2col or shifted views), so one binary times both paths. Built by nvcc or
// hipcc (run_on_device.sh), it then times the same stack on the GPU (the vendor BLAS where the unit
// has it), whole batches per convolution, against its GEMMs alone on the same shapes in the same
// run (what the lowering, bias and layout kernels add on top of the floor the BLAS sets).
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
#if DTRAIN_DEVICE_CODE
#include <dtrain/kernels/gpu_exec.cuh>
#endif

#if !DTRAIN_DEVICE_CODE
#include "fma_peak.hpp"
#else
// nvcc's device front end does not take fma_peak.hpp's vector code: a device build does not
// measure the host peak (its host line then reads 0% of a peak of 0).
namespace dtrain_bench {
inline double fma_peak_gflops(const char** isa) {
  return *isa = "not measured in a device build", 0.0;
}
}  // namespace dtrain_bench
#endif

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#if DTRAIN_DEVICE_CODE
#if defined(DTRAIN_GPU_VENDOR_BLAS)
using DeviceExec = dtrain::GpuBlasExec;
constexpr const char* device_gemm = "vendor BLAS";
#else
using DeviceExec = dtrain::GpuExec;
constexpr const char* device_gemm = "tiled GEMM";
#endif

// Median milliseconds of f() over reps runs after 3 warm-ups, the device synchronised each time.
template <class F>
double device_ms(DeviceExec& exec, int reps, F f) {
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    const double t0 = seconds();
    f();
    dtrain::exec_synchronize(exec, exec.compute_stream(), 60, "conv_bench");
    if (i >= 3) t.push_back(seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1e3;
}

void bench_device(std::int64_t batch, std::int64_t grid, std::int64_t ch, int reps,
                  const std::vector<float>& x, const std::vector<float>& y) {
  namespace gpu = dtrain::gpu;
  if (gpu::device_count() == 0) {
    std::printf("dtrain conv stack on a GPU: not run (no %s device visible)\n", gpu::vendor);
    return;
  }
  DeviceExec exec;
  dtrain::BasicSequential<float, DeviceExec> model(
      {dtrain::Input{1, grid, grid}, dtrain::Conv2d(1, ch, 3).with_padding(1), dtrain::Relu{},
       dtrain::Conv2d(ch, ch, 3).with_padding(1), dtrain::Relu{},
       dtrain::Conv2d(ch, 1, 3).with_padding(1)},
      exec);
  model.init(1);
  const double step = device_ms(exec, reps, [&] {
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), batch, dtrain::Loss::mse);
  });
  // The GEMMs of the step on the same shapes: per convolution (in, out) with K = in x 9 and
  // N = batch x grid^2: forward C x N x K, weight gradient C x K x N, input gradient K x N x C
  // (none for the first, whose input needs no gradient).
  const std::int64_t n = batch * grid * grid;
  const std::int64_t shapes[3][2] = {{1, ch}, {ch, ch}, {ch, 1}};
  std::int64_t most = 0;
  for (const auto& sh : shapes) most = std::max(most, std::max(sh[0] * 9, sh[1]) * n);
  gpu::DeviceBuffer<float> a(static_cast<std::size_t>(ch * ch * 9)),
      b(static_cast<std::size_t>(most)), c(static_cast<std::size_t>(most));
  exec.fill(exec.compute_stream(), a.data(), a.size(), 0.5f);
  exec.fill(exec.compute_stream(), b.data(), b.size(), 0.25f);
  const double gemms = device_ms(exec, reps, [&] {
    const auto s = exec.compute_stream();
    for (int l = 0; l < 3; ++l) {
      const std::int64_t k = shapes[l][0] * 9, co = shapes[l][1];
      exec.gemm(s, false, false, co, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
      exec.gemm(s, false, true, co, k, n, 1.0f, b.data(), n, c.data(), n, 1.0f, a.data(), k);
      if (l > 0)
        exec.gemm(s, true, false, k, n, co, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    }
  });
  const double macs = static_cast<double>(n) * 9.0 * double(ch + ch * ch + ch);
  std::printf(
      "dtrain conv stack on %s (%s) batch=%lld grid=%lld channels=%lld: median %.3f ms/step, "
      "%.1f GFLOP/s; its GEMMs alone %.3f ms (%.2fx of the step)\n",
      gpu::vendor, device_gemm, static_cast<long long>(batch), static_cast<long long>(grid),
      static_cast<long long>(ch), step, 2.0 * macs * 3.0 / (step * 1e-3) / 1e9, gemms,
      step / gemms);
}
#endif
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
    const double t0 = seconds(), c0 = dtrain_bench::cpu_seconds();
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), batch, dtrain::Loss::mse);
    if (i >= 5) {
      times.push_back(seconds() - t0);
      cpu.push_back(dtrain_bench::cpu_seconds() - c0);
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
  const double peak = dtrain_bench::fma_peak_gflops(&isa);
  std::printf(
      "dtrain conv stack batch=%lld grid=%lld channels=%lld (%s, %s): median %.2f ms/step (%.2f "
      "ms CPU), %.2f GFLOP/s of CPU time, %.0f%% of the measured %s FMA peak %.1f GFLOP/s\n",
      static_cast<long long>(batch), static_cast<long long>(grid), static_cast<long long>(ch),
      lowering, dtrain::host::conv_isa_name(mid.direct_isa()), ms, cpu_ms, gflops,
      peak > 0 ? 100.0 * gflops / peak : 0.0, isa, peak);
#if DTRAIN_DEVICE_CODE
  bench_device(batch, grid, ch, reps, x, y);
#endif
  return 0;
}
