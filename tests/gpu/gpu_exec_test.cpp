// The GPU execution policy: it satisfies the policy requirements (checked at compile time by
// nvcc and hipcc in every CI run), BasicSequential and BasicAdamW / BasicSgd instantiate on it,
// and, on a machine with a GPU, a short training run on the device follows the host run of the
// same seed step by step (loss within 1e-4 relative, parameters within 1e-4 after 30 steps; the
// two differ only by rounding order: tiled GEMM vs blocked GEMM, device libm, FMA contraction).
// Without a GPU the process prints what is missing and exits 77 (skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/exec/exec_copier.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/kernels/gpu_exec.cuh>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>

#include "support/skip.hpp"
#include "support/watchdog.hpp"

namespace gpu = dtrain::gpu;

static_assert(dtrain::is_exec_policy_v<dtrain::GpuExec>, "GpuExec is an execution policy");
#if defined(DTRAIN_GPU_VENDOR_BLAS)
static_assert(dtrain::is_exec_policy_v<dtrain::GpuBlasExec>, "GpuBlasExec is an execution policy");
#endif
// Explicit instantiations: every member of the model and the optimizers compiles for the device
// policy, whether or not this test calls it.
template class dtrain::BasicSequential<float, dtrain::GpuExec>;
template class dtrain::BasicSequential<double, dtrain::GpuExec>;
template class dtrain::BasicAdamW<dtrain::GpuExec>;
template class dtrain::BasicSgd<dtrain::GpuExec>;
template class dtrain::detail::ElementwiseOptimizer<dtrain::GpuExec, dtrain::detail::AdamWRule>;
template class dtrain::detail::ElementwiseOptimizer<dtrain::GpuExec, dtrain::detail::SgdRule>;
template class dtrain::GradNormClipper<dtrain::GpuExec>;

namespace {
std::vector<float> params_on_host(const dtrain::BufferView& v, gpu::GpuExec* exec) {
  std::vector<float> out(v.count);
  if (exec) {
    exec->copy_d2h(exec->compute_stream(), out.data(), v.data, v.count * sizeof(float));
    dtrain::exec_synchronize(*exec, exec->compute_stream(), 60, "test");
  } else {
    const float* p = static_cast<const float*>(v.data);
    out.assign(p, p + v.count);
  }
  return out;
}
}  // namespace

TEST_CASE("a short training run on the device follows the host run of the same seed") {
  const std::int64_t batch = 32, in = 24, classes = 5;
  const std::vector<dtrain::LayerSpec> layers = {
      dtrain::Linear(in, 48), dtrain::Relu(), dtrain::LayerNorm(48),      dtrain::Dropout(0.1f),
      dtrain::Linear(48, 32), dtrain::Gelu(), dtrain::Linear(32, classes)};
  dtrain::HostExec host_exec;
  gpu::GpuExec dev_exec;
  dtrain::BasicSequential<float, dtrain::HostExec> host_model(layers, host_exec);
  dtrain::BasicSequential<float, gpu::GpuExec> dev_model(layers, dev_exec);
  host_model.init(7);
  dev_model.init(7);
  CHECK(params_on_host(dev_model.parameters(), &dev_exec) ==
        params_on_host(host_model.parameters(), nullptr));
  dtrain::BasicAdamW<dtrain::HostExec> host_opt(host_model, 1e-2);
  dtrain::BasicAdamW<gpu::GpuExec> dev_opt(dev_model, 1e-2);

  dtrain::RngStream rng(11, 0);
  std::vector<float> x(static_cast<std::size_t>(batch * in));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    for (auto& v : x) v = static_cast<float>(2.0 * rng.uniform_double() - 1.0);
    for (std::size_t r = 0; r < labels.size(); ++r)
      labels[r] = static_cast<std::int32_t>((r * 7 + static_cast<std::size_t>(step)) % classes);
    host_model.zero_grad();
    dev_model.zero_grad();
    const double lh = host_model.forward_backward(x.data(), labels.data(), batch);
    const double ld = dev_model.forward_backward(x.data(), labels.data(), batch);
    host_opt.step();
    dev_opt.step();
    INFO("step " << step << ": host loss " << lh << ", device loss " << ld);
    CHECK(ld == doctest::Approx(lh).epsilon(1e-4));
    if (step == 0) first = lh;
    last = lh;
  }
  CHECK(last < first);  // it trains
  const auto ph = params_on_host(host_model.parameters(), nullptr);
  const auto pd = params_on_host(dev_model.parameters(), &dev_exec);
  double worst = 0;
  for (std::size_t i = 0; i < ph.size(); ++i)
    worst =
        std::max(worst, std::abs(double(pd[i]) - ph[i]) / std::max(1.0, std::abs(double(ph[i]))));
  MESSAGE("max relative parameter difference after 30 steps: " << worst);
  CHECK(worst < 1e-4);
}

TEST_CASE("grid layers on the device: the same loss and gradients as the host") {
  // Every grid layer kind (their device functors: im2col, col2im, pooling, upsampling, the skip)
  // on the device against the host model of the same seed and parameters.
  const std::vector<dtrain::LayerSpec> layers = {
      dtrain::Input{2, 16, 16},
      dtrain::Conv2d(2, 8, 3).with_padding(1, dtrain::Padding::periodic),
      dtrain::Relu(),
      dtrain::Residual{dtrain::Conv2d(8, 8, 3).with_padding(1), dtrain::Tanh()},
      dtrain::MaxPool2d(2),
      dtrain::Conv2d(8, 4, 3).with_padding(1).with_stride(2),
      dtrain::Upsample2d(2),
      dtrain::AvgPool2d(2, 1),
      dtrain::Conv2d(4, 1, 1)};
  dtrain::HostExec host_exec;
  gpu::GpuExec dev_exec;
  dtrain::BasicSequential<float, dtrain::HostExec> host_model(layers, host_exec);
  dtrain::BasicSequential<float, gpu::GpuExec> dev_model(layers, dev_exec);
  host_model.init(5);
  dev_model.init(5);
  const std::int64_t batch = 6;
  dtrain::RngStream rng(2, 0);
  std::vector<float> x(static_cast<std::size_t>(batch * host_model.in_features()));
  std::vector<float> t(static_cast<std::size_t>(batch * host_model.out_features()));
  for (auto& v : x) v = static_cast<float>(2.0 * rng.uniform_double() - 1.0);
  for (auto& v : t) v = static_cast<float>(rng.uniform_double());
  const double lh = host_model.forward_backward(x.data(), t.data(), batch, dtrain::Loss::mse);
  const double ld = dev_model.forward_backward(x.data(), t.data(), batch, dtrain::Loss::mse).get();
  CHECK(ld == doctest::Approx(lh).epsilon(1e-5));
  const auto gh = params_on_host(host_model.gradients(), nullptr);
  const auto gd = params_on_host(dev_model.gradients(), &dev_exec);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < gh.size(); ++i) {
    worst = std::max(worst, std::abs(double(gd[i]) - gh[i]));
    scale = std::max(scale, std::abs(double(gh[i])));
  }
  MESSAGE("grid layers: max gradient difference " << worst << " (largest gradient " << scale
                                                  << ")");
  CHECK(worst < 1e-4 * std::max(1.0, scale));
}

TEST_CASE("gradient clipping on the device equals the host clip to rounding") {
  const std::size_t n = 300000;  // several blocks of the partial sums
  dtrain::RngStream rng(3, 1);
  std::vector<float> g(n);
  for (auto& v : g) v = static_cast<float>(2.0 * rng.uniform_double() - 1.0);
  gpu::GpuExec exec;
  gpu::DeviceBuffer<float> d(n);
  d.upload(g.data());
  dtrain::GradNormClipper<gpu::GpuExec> clip(exec);
  const double dn = clip(dtrain::BufferView(d.data(), n, dtrain::DType::f32, gpu::space), 1.0);
  std::vector<float> h = g;
  const double hn =
      dtrain::clip_grad_norm(dtrain::BufferView(h.data(), n, dtrain::DType::f32), 1.0);
  CHECK(hn > 1.0);
  CHECK(dn == doctest::Approx(hn).epsilon(1e-12));  // double sums in another order
  std::vector<float> back(n);
  dtrain::exec_synchronize(exec, exec.compute_stream(), 60, "test");
  d.download(back.data());
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(back[i]) - h[i]));
  CHECK(worst <= 1e-7);
}

TEST_CASE("checkpoint copies of device tensors go through the policy's copies") {
  gpu::GpuExec exec;
  const std::size_t n = 4097;
  std::vector<float> src(n), dst(n, 0.f);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
  gpu::DeviceBuffer<float> d(n);
  const dtrain::ExecCopier c = dtrain::ExecCopier::of(exec);
  CHECK(c.space == gpu::space);
  c.upload(c.exec, d.data(), src.data(), n * sizeof(float));
  c.download(c.exec, dst.data(), d.data(), n * sizeof(float));
  c.wait(c.exec, "test");
  CHECK(dst == src);
}

TEST_CASE("policy events order streams and report completion") {
  gpu::GpuExec exec;
  auto side = exec.create_stream();
  auto ev = exec.create_event();
  const std::size_t n = 1 << 20;
  gpu::DeviceBuffer<float> a(n), b(n);
  exec.fill(exec.compute_stream(), a.data(), n, 2.5f);
  exec.record(ev, exec.compute_stream());
  exec.stream_wait(side, ev);  // the copy on `side` must see the fill
  exec.copy_d2d(side, b.data(), a.data(), n * sizeof(float));
  CHECK(exec.synchronize(side, dtrain::Deadline(60)));
  CHECK(exec.query(ev));
  std::vector<float> h(n);
  b.download(h.data());
  CHECK(h.front() == 2.5f);
  CHECK(h.back() == 2.5f);
  exec.destroy_event(ev);
  exec.destroy_stream(side);
}

int main(int argc, char** argv) {
  if (gpu::device_count() == 0)
    dtrain::test::skip_process((std::string("no ") + gpu::vendor + " device visible").c_str());
  dtrain::test::Watchdog watchdog([](double s) {
    std::fprintf(stderr, "dtrain gpu test watchdog: still running after %.0f s, aborting\n", s);
    std::_Exit(124);
  });
  doctest::Context context(argc, argv);
  return context.run();
}
