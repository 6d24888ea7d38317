// ParameterSet on a device policy: the test-only emulated device
// (tests/support/emulated_device.hpp, whose memory faults when host code touches it). Owned arenas
// in device memory initialised as on the host, AdamW on them giving the host's bits, the state
// protocol staging device tensors through host memory into owned and adopted device arenas, and
// GradientSync averaging a device set's gradients over two thread ranks.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "support/emulated_device.hpp"
#include "support/memory_state.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/parameter_set.hpp>
#include <dtrain/optim/adamw.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_own_model_device_test {

using namespace dtrain;
using test::bytes_of;
using test::EmulatedDevice;
using DevSet = BasicParameterSet<float, EmulatedDevice>;

namespace {
std::vector<ParameterSpec> specs() {
  return {{"conv/kernel", {4, 3, 3}, ParameterInit::kaiming_normal},
          {"conv/bias", {4}, ParameterInit::ones},
          {"out/weight", {2, 12}, ParameterInit::xavier_uniform},
          {"out/bias", {2}}};
}
void upload(EmulatedDevice& dev, BufferView dst, const std::vector<float>& src) {
  dev.copy_h2d(dev.compute_stream(), dst.data, src.data(), src.size() * sizeof(float));
  exec_synchronize(dev, dev.compute_stream(), 30, "test upload");
}
}  // namespace

TEST_CASE("own_model: a set in device memory initialises, steps and checkpoints as on the host") {
  EmulatedDevice dev;
  DevSet dset(specs(), dev);
  ParameterSet hset(specs());
  CHECK(dset.parameters().space == EmulatedDevice::space);
  CHECK(dev.is_device(dset.tensor("out/weight").param));
  CHECK(dev.is_device(dset.tensor("out/weight").grad));
  CHECK_THROWS_AS(dset.parameter_span(), InvalidArgument);
  dset.init(4);
  hset.init(4);
  CHECK(bytes_of(dev, dset.parameters()) == bytes_of(hset.parameters()));
  CHECK(bytes_of(dev, dset.gradients()) == bytes_of(hset.gradients()));

  BasicAdamW<EmulatedDevice> dopt(dset, 0.01);
  AdamW hopt(hset, 0.01);
  std::vector<float> g(hset.parameter_count());
  for (int step = 0; step < 3; ++step) {
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = static_cast<float>((k * 7 + step) % 11) - 5;
    upload(dev, dset.gradients(), g);
    for (std::size_t k = 0; k < g.size(); ++k) hset.gradient_span()[k] = g[k];
    dopt.step();
    hopt.step();
  }
  CHECK(bytes_of(dev, dset.parameters()) == bytes_of(hset.parameters()));

  // Saved from the device (downloaded through the mirror), loaded on the host, and into a device
  // arena the application allocated itself (uploaded).
  test::MemoryState saved;
  dset.visit_state(saved);
  saved.load = true;
  ParameterSet back(specs());
  back.visit_state(saved);
  CHECK(back.seed() == 4);
  CHECK(bytes_of(back.parameters()) == bytes_of(hset.parameters()));
  const auto n = static_cast<std::int64_t>(hset.parameter_count());
  Tensor mine_p({n}, DType::f32, dev.allocator()), mine_g({n}, DType::f32, dev.allocator());
  DevSet adopted(mine_p.view(), mine_g.view(), specs(), dev);
  CHECK_FALSE(adopted.owns_memory());
  CHECK(adopted.tensor(1).param == static_cast<float*>(mine_p.raw()) + 36);
  adopted.visit_state(saved);
  CHECK(bytes_of(dev, mine_p.view()) == bytes_of(hset.parameters()));
  // A device buffer offered to a host set is refused.
  CHECK_THROWS_AS(ParameterSet(mine_p.view(), mine_g.view(), specs()), InvalidArgument);
}

TEST_CASE("own_model: GradientSync averages a device set's gradients over two ranks") {
  std::atomic<int> bad{0};
  run_loopback(2, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 30;
    Communicator comm(t, c);
    EmulatedDevice dev;
    DevSet set(specs(), dev);
    BasicGradientSync<EmulatedDevice> sync(dev, comm, set.gradients(), 64);
    std::vector<float> g(set.parameter_count());
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = static_cast<float>((t.rank() + 1) * k);
    for (std::size_t i = set.size(); i-- > 0;) {
      const auto r = set.tensor(i);
      dev.copy_h2d(dev.compute_stream(), r.grad, g.data() + r.offset, r.count * sizeof(float));
      set.grad_ready(i, sync);  // in stream order, after its upload
    }
    sync.wait();
    std::vector<float> avg(g.size());
    dev.copy_d2h(dev.compute_stream(), avg.data(), set.gradients().data, g.size() * sizeof(float));
    exec_synchronize(dev, dev.compute_stream(), 30, "test download");
    for (std::size_t k = 0; k < g.size(); ++k)
      if (avg[k] != 1.5f * static_cast<float>(k)) ++bad;
  });
  CHECK(bad.load() == 0);
}

}  // namespace dtrain_test_own_model_device_test
