// Example 03: a user layer with its own kernels (learned_swish.hpp) in a Sequential: float64
// gradient check, float training, and (built by nvcc or hipcc, on a GPU) device against host.
// Exits non-zero when a check fails (77 from a GPU build on a machine without a GPU).
#include <cmath>
#include <cstdio>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#if DTRAIN_DEVICE_CODE
#include <dtrain/kernels/gpu_exec.cuh>
#endif

#include "learned_swish.hpp"

template <class T, class Exec>
std::vector<dtrain::LayerEntry<T, Exec>> layers() {  // a user layer mixes with built-in ones,
  return {dtrain::Linear(2, 16), dtrain::custom<LearnedSwish>(),  // inside a skip connection too
          dtrain::Linear(16, 16),
          dtrain::Residual{dtrain::custom<LearnedSwish>(), dtrain::Linear(16, 16)},
          dtrain::Linear(16, 1)};
}
template <class T>
std::vector<T> samples(std::int64_t n, std::uint64_t seed, std::vector<T>& y) {
  dtrain::RngStream rng(seed, 0);
  std::vector<T> x(static_cast<std::size_t>(2 * n));
  y.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    x[2 * i] = T(4 * rng.uniform_double() - 2), x[2 * i + 1] = T(4 * rng.uniform_double() - 2);
    y[i] = std::sin(x[2 * i]) * x[2 * i + 1];  // the function to learn
  }
  return x;
}

int main() {
  // 1. Gradients of every parameter against central differences, in float64.
  dtrain::BasicSequential<double> check(layers<double, dtrain::HostExec>());
  check.init(3);
  std::vector<double> y;
  const auto x = samples<double>(8, 1, y);
  const dtrain::GradientCheck gc = dtrain::check_gradients(check, x.data(), y.data(), 8);
  std::printf("gradient check: relative error %.2e against central differences\n",
              gc.relative_error);
  if (!(gc.relative_error < 1e-6)) return 1;

  // 2. Training in float: the layer's slopes sit in the arenas like any weight.
  dtrain::Sequential model(layers<float, dtrain::HostExec>());
  model.init(7);
  dtrain::AdamW opt(model, 0.01);
  std::vector<float> yt;
  const auto xt = samples<float>(4096, 2, yt);
  double loss = 0;
  for (int step = 0; step < 600; ++step) {
    const std::int64_t first = (step % 64) * 64;
    model.zero_grad();
    loss = model.forward_backward(xt.data() + 2 * first, yt.data() + first, 64, dtrain::Loss::mse);
    opt.step();
  }
  std::printf("after 600 steps: loss %.4f; slopes stored as %s\n", loss,
              model.parameter_info()[2].name.c_str());
  if (!(loss < 0.02)) return 1;

#if DTRAIN_DEVICE_CODE
  // 3. The device kernels against the host kernels, same seed and batch.
  if (dtrain::gpu::device_count() == 0) {
    std::printf("no GPU: device check skipped\n");
    return 77;
  }
  dtrain::GpuExec gpu;
  dtrain::BasicSequential<float, dtrain::GpuExec> dev(layers<float, dtrain::GpuExec>(), gpu);
  dev.init(7);
  model.init(7);
  const double lh = model.forward_backward(xt.data(), yt.data(), 64, dtrain::Loss::mse);
  const double ld = dev.forward_backward(xt.data(), yt.data(), 64, dtrain::Loss::mse).get();
  std::printf("device loss %.6f, host loss %.6f\n", ld, lh);
  if (!(std::fabs(ld - lh) <= 1e-4 * std::fabs(lh))) return 1;
#endif
  std::printf("OK\n");
  return 0;
}
