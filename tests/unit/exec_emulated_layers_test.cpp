// Grid layers on the emulated device: with its host kernels (EmulatedDevice) a convolutional model
// gives HostExec's bits; through the functors a GPU runs (EmulatedGpu) its gradients match float64
// finite differences, with device memory the host never touches.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/emulated_device.hpp"

#include <dtrain/core/rng.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/model/model.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_exec_emulated_layers_test {

using namespace dtrain;
using test::bytes_of;
using test::EmulatedDevice;
using test::EmulatedGpu;

namespace {

template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  RngStream rng(seed, 7);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(lo + (hi - lo) * rng.uniform_double());
  return v;
}

// A small surrogate-shaped model: every grid layer kind, periodic and zero padding, a skip.
template <class T, class Exec>
std::vector<LayerEntry<T, Exec>> cnn() {
  return {Input{2, 6, 6}, Conv2d(2, 3, 3).with_padding(1, Padding::periodic),
          Tanh{},         Residual{Conv2d(3, 3, 3).with_padding(1), Gelu{}, Conv2d(3, 3, 1)},
          MaxPool2d(2),   Conv2d(3, 2, 3).with_padding(1).with_stride(2),
          Upsample2d(2),  AvgPool2d(2, 1),
          Conv2d(2, 1, 1)};
}

}  // namespace

TEST_SUITE("emulated_model") {
  TEST_CASE("a convolutional model on the emulated device equals HostExec bit for bit") {
    EmulatedDevice dev;
    BasicSequential<float> host(cnn<float, HostExec>());
    BasicSequential<float, EmulatedDevice> model(cnn<float, EmulatedDevice>(), dev);
    host.init(4);
    model.init(4);
    const std::int64_t rows = 5;
    const auto x = random_vec<float>(static_cast<std::size_t>(rows * host.in_features()), 1);
    const auto t = random_vec<float>(static_cast<std::size_t>(rows * host.out_features()), 2);
    const double lh = host.forward_backward(x.data(), t.data(), rows, Loss::mse);
    const double ld = model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
    CHECK(lh == ld);
    CHECK(bytes_of(dev, model.gradients()) == bytes_of(host.gradients()));
  }

  TEST_CASE("through the GPU's functors, grid-layer gradients match float64 finite differences") {
    EmulatedGpu dev;
    BasicSequential<double, EmulatedGpu> model(cnn<double, EmulatedGpu>(), dev);
    BasicSequential<double> host(cnn<double, HostExec>());
    model.init(9);
    host.init(9);
    const std::int64_t rows = 2;
    const auto x = random_vec<double>(static_cast<std::size_t>(rows * model.in_features()), 3);
    const auto t = random_vec<double>(static_cast<std::size_t>(rows * model.out_features()), 4);
    auto params = random_vec<double>(model.parameter_count(), 5, -0.5, 0.5);
    auto upload = [&] {
      dev.copy_h2d(dev.compute_stream(), model.parameters().data, params.data(),
                   params.size() * sizeof(double));
    };
    upload();
    model.zero_grad();
    model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
    std::vector<double> g(params.size());
    dev.copy_d2h(dev.compute_stream(), g.data(), model.gradients().data, g.size() * sizeof(double));
    exec_synchronize(dev, dev.compute_stream(), 60, "test");
    // The same gradients as the host lowering, up to the order of col2im's sums.
    std::memcpy(host.parameter_span().data(), params.data(), params.size() * sizeof(double));
    host.zero_grad();
    host.forward_backward(x.data(), t.data(), rows, Loss::mse);
    double diff = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
      diff = std::max(diff, std::abs(g[i] - host.gradient_span()[i]));
    CHECK(diff < 1e-12);
    // Central differences through the device path, on every 3rd parameter (all kinds covered).
    double num = 0, den = 0;
    const double h = 1e-5;
    for (std::size_t i = 0; i < params.size(); i += 3) {
      const double keep = params[i];
      params[i] = keep + h;
      upload();
      const double lp = model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
      params[i] = keep - h;
      upload();
      const double lm = model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
      params[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      num += (g[i] - fd) * (g[i] - fd);
      den += fd * fd;
    }
    REQUIRE(den > 0);
    CHECK(std::sqrt(num / den) < 1e-6);
  }
}

}  // namespace dtrain_test_exec_emulated_layers_test
