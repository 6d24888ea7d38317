// Device gradients averaged through device IPC among the ranks of a node (GradientSync on the
// emulated device with IPC on, rank threads): the choice and DTRAIN_DEVICE_IPC's rule, the bits
// against a host rank-order reference and the staged path on one node and on several (between
// nodes handed to the transport or staged), windows opened once and closed with the sync, and a
// rank that never comes.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "support/device_loopback.hpp"
#include "support/emulated_device.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/device_ipc.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/transports/loopback.hpp>

// Its own namespace: test_exec compiles its sources as one unity translation unit.
namespace dtrain_test_exec_ipc {
using namespace dtrain;
using test::bytes_of;
using test::DeviceLoopbackTransport;
using test::EmulatedDevice;

// Rank r's gradients of step s: of mixed magnitudes, so that the summation order shows.
std::vector<float> ipc_grads(int r, int s, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h =
        (static_cast<std::uint64_t>(r) * 7777777u + s * 104729u + i) * 0x9E3779B97F4A7C15ull;
    const float u = static_cast<float>((h >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
    g[i] = u * (i % 3 == 1 ? 1e4f : 1e-3f);
  }
  return g;
}
// The host reference: every rank's gradients summed in rank order in f32, divided by p.
std::vector<unsigned char> ipc_reference(int p, int s, std::size_t n) {
  std::vector<float> want = ipc_grads(0, s, n);
  for (int q = 1; q < p; ++q) {
    const std::vector<float> x = ipc_grads(q, s, n);
    for (std::size_t i = 0; i < n; ++i) want[i] += x[i];
  }
  for (float& w : want) w /= static_cast<float>(p);
  std::vector<unsigned char> b(n * sizeof(float));
  std::memcpy(b.data(), want.data(), b.size());
  return b;
}
// One step: upload, report in two pieces (later buckets first, as a backward pass), wait.
std::vector<unsigned char> ipc_step(EmulatedDevice& dev, BasicGradientSync<EmulatedDevice>& sync,
                                    Tensor& g, int r, int s) {
  const std::size_t n = g.view().count;
  const std::vector<float> h = ipc_grads(r, s, n);
  dev.copy_h2d(dev.compute_stream(), g.view().data, h.data(), n * sizeof(float));
  sync.ready(n / 3, n - n / 3);
  sync.ready(0, n / 3);
  sync.wait();
  return bytes_of(dev, g.view());
}
EmulatedDevice::Options ipc_options(bool ipc, bool lazy = true) {
  EmulatedDevice::Options o;
  o.ipc = ipc;
  o.lazy = lazy;  // eager: the streams run at once, concurrently with the host and the ranks
  return o;
}
SharedSegmentConfig no_segments() {
  SharedSegmentConfig c;
  c.enabled = false;
  return c;
}

TEST_SUITE("emulated_ipc") {
  TEST_CASE("device IPC: where the rule takes it, and DTRAIN_DEVICE_IPC") {
    using detail::choose_device_ipc;
    const DeviceBuffers takes{true, "takes"}, refuses{false, "refuses"};
    const NodeMap one = NodeMap::single(3), two({0, 0, 1, 1}), mixed({0, 1, 0, 1});
    const std::optional<std::string> unset, on("1"), off("0"), autov("auto");
    CHECK(choose_device_ipc(true, DType::f32, one, refuses, unset).use);
    CHECK(choose_device_ipc(true, DType::f64, one, refuses, autov).use);
    CHECK_FALSE(choose_device_ipc(true, DType::f32, one, refuses, off).use);
    const detail::DeviceIpcChoice t2 = choose_device_ipc(true, DType::i32, two, takes, on);
    CHECK(t2.use);
    CHECK(t2.direct);
    CHECK(t2.why.find("2x2") != std::string::npos);
    CHECK_FALSE(choose_device_ipc(true, DType::f32, two, refuses, unset).direct);
    // Reasons against it: auto says why and leaves it; 1 refuses naming the variable.
    struct Against {
      bool policy;
      DType dtype;
      NodeMap nodes;
      const char* says;
    };
    for (const Against& a :
         {Against{false, DType::f32, one, "cannot share"}, Against{true, DType::bf16, one, "bf16"},
          Against{true, DType::f32, NodeMap::separate(3), "no two ranks"},
          Against{true, DType::f32, mixed, "consecutive"}}) {
      CAPTURE(a.says);
      const detail::DeviceIpcChoice c = choose_device_ipc(a.policy, a.dtype, a.nodes, takes, unset);
      CHECK_FALSE(c.use);
      CHECK(c.why.find(a.says) != std::string::npos);
      CHECK_THROWS_WITH_AS(choose_device_ipc(a.policy, a.dtype, a.nodes, takes, on),
                           doctest::Contains("DTRAIN_DEVICE_IPC=1"), InvalidArgument);
    }
    CHECK_FALSE(choose_device_ipc(true, DType::f32, NodeMap::single(1), takes, on).use);
    CHECK_THROWS_WITH_AS(choose_device_ipc(true, DType::f32, one, takes, std::string("yes")),
                         doctest::Contains("DTRAIN_DEVICE_IPC"), InvalidArgument);

    // GradientSync: device IPC where the device shares its memory, else the transport's choice.
    run_loopback(2, [](LoopbackTransport& lt) {
      for (bool ipc : {true, false}) {
        EmulatedDevice dev(ipc_options(ipc));
        DeviceLoopbackTransport t(lt, dev, true);
        Communicator comm(t);
        Tensor g({10}, DType::f32, dev.allocator());
        BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 16);
        CHECK(sync.device_ipc() == ipc);
        CHECK(sync.handed_over() == !ipc);
        CHECK_FALSE(sync.staged());
        CHECK(sync.bucket_algorithm(0) == AllreduceAlgorithm::ordered);
        CHECK(dev.ipc_mapped() == (ipc ? 1u : 0u));
      }
    });
  }

  TEST_CASE("device IPC on rank threads: the host reference's and the staged path's bits") {
    struct Layout {
      std::vector<int> nodes;
      bool direct;  // between nodes: the transport takes device buffers
      bool lazy;
    };
    for (const Layout& lay : {Layout{{0, 0, 0}, true, true}, Layout{{0, 0, 0}, true, false},
                              Layout{{0, 0, 1, 1}, true, true}, Layout{{0, 0, 1, 1}, false, false},
                              Layout{{0, 0, 0, 1}, false, true}, Layout{{0, 1, 1}, true, true}}) {
      const int p = static_cast<int>(lay.nodes.size());
      CAPTURE(p);
      CAPTURE(lay.nodes[1]);
      CAPTURE(lay.nodes[p - 1]);
      CAPTURE(lay.direct);
      CAPTURE(lay.lazy);
      const std::size_t n = 41;  // buckets of 6 floats: parts of 1 or 2 elements, some empty
      const int steps = 3;
      std::atomic<int> failures{0};
      LoopbackWorld world(lay.nodes, no_segments());
      run_loopback(world, [&](LoopbackTransport& lt) {
        const int r = lt.rank();
        try {
          const NodeMap& nm = world.node_map();
          const std::uint64_t peers = static_cast<std::uint64_t>(nm.node_size(nm.node_of(r)) - 1);
          CommConfig c;
          c.timeout_s = 30;
          c.reproducible = true;  // the staged all-reduce sums in rank order too
          std::vector<std::vector<unsigned char>> got, staged;
          {
            EmulatedDevice dev(ipc_options(true, lay.lazy));
            DeviceLoopbackTransport t(lt, dev, lay.direct);
            Communicator comm(t, c);
            Tensor g({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
            {
              BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 24);
              REQUIRE(sync.device_ipc());
              for (int s = 0; s < steps; ++s) got.push_back(ipc_step(dev, sync, g, r, s));
              // The node's windows were opened once, at construction, and reused every step.
              CHECK(dev.ipc_opened() == peers);
              CHECK(dev.ipc_mapped() == peers);
              // Within a node only flags go over the transport, and between nodes device bytes
              // go to it only when it takes them.
              if (!lay.direct || nm.nodes() == 1) CHECK(t.device_bytes_sent() == 0);
              if (lay.direct && nm.nodes() > 1) CHECK(t.device_bytes_sent() > 0);
            }
            CHECK(dev.ipc_mapped() == 0);  // closed with the sync
          }
          {
            EmulatedDevice dev;  // no IPC: staged through host memory
            DeviceLoopbackTransport t(lt, dev, false);
            Communicator comm(t, c);
            Tensor g({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
            BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 24);
            REQUIRE(sync.staged());
            for (int s = 0; s < steps; ++s) staged.push_back(ipc_step(dev, sync, g, r, s));
          }
          for (int s = 0; s < steps; ++s) {
            CAPTURE(s);
            CHECK(got[static_cast<std::size_t>(s)] == ipc_reference(p, s, n));
            CHECK(got[static_cast<std::size_t>(s)] == staged[static_cast<std::size_t>(s)]);
          }
        } catch (const std::exception& e) {
          MESSAGE(std::string(e.what()));
          ++failures;
        }
      });
      CHECK(failures.load() == 0);
    }
  }

  TEST_CASE("device IPC: a rank of the node that never builds the sync times out the setup") {
    std::atomic<int> caught{0};
    run_loopback(2, [&](LoopbackTransport& lt) {
      if (lt.rank() == 1) return;
      EmulatedDevice dev(ipc_options(true));
      DeviceLoopbackTransport t(lt, dev, true);
      CommConfig c;
      c.timeout_s = 0.3;
      Communicator comm(t, c);
      Tensor g({8}, DType::f32, dev.allocator());
      try {
        BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 64);
      } catch (const TimeoutError& e) {
        const std::string m = e.what();
        CHECK(m.find("device IPC") != std::string::npos);
        CHECK(m.find("setup") != std::string::npos);
        CHECK(m.find("rank 1") != std::string::npos);
        ++caught;
      }
      CHECK(dev.ipc_mapped() == 0);
    });
    CHECK(caught.load() == 1);
  }
}

}  // namespace dtrain_test_exec_ipc
