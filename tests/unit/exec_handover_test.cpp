// Device gradients handed to a transport that takes device buffers (GradientSync's hand-over),
// on the emulated device: the choice, the bits against the staged path and a host reference,
// the traffic, and a peer that never comes.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "support/device_loopback.hpp"
#include "support/emulated_device.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/transports/loopback.hpp>

using namespace dtrain;
using test::bytes_of;
using test::DeviceLoopbackTransport;
using test::EmulatedDevice;

namespace {
// Rank r's gradients of step s: seeded, of mixed magnitudes so that the summation order shows.
std::vector<float> handover_grads(int r, int s, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h =
        (static_cast<std::uint64_t>(r) * 1000003u + s * 7919u + i) * 0x9E3779B97F4A7C15ull;
    const float u = static_cast<float>((h >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
    g[i] = u * (i % 3 == 0 ? 1e4f : 1e-3f);
  }
  return g;
}
// One step of `sync` on `dev`: uploads rank r's gradients and reports them, in two pieces on
// even steps, bucket by bucket with every rank in step on odd ones (a barrier after each
// report: the next report finds the earlier buckets' parts arrived and moves them on without
// waiting), then waits; returns the averaged bits.
template <class Comm>
std::vector<unsigned char> handover_step(EmulatedDevice& dev,
                                         BasicGradientSync<EmulatedDevice>& sync, Comm& comm,
                                         Tensor& g, int r, int s) {
  const std::size_t n = g.view().count;
  const std::vector<float> h = handover_grads(r, s, n);
  dev.copy_h2d(dev.compute_stream(), g.view().data, h.data(), h.size() * sizeof(float));
  exec_synchronize(dev, dev.compute_stream(), 30, "test upload");
  if (s % 2 == 0) {
    sync.ready(n / 2, n - n / 2);
    sync.ready(0, n / 2);
  } else {
    for (std::size_t b = 0; b < sync.bucket_count(); ++b) {
      sync.ready(sync.bucket_range(b).first, sync.bucket_range(b).second);
      // (The staged buckets are collectives of the communicator, which the barrier would
      // interleave with differently on each rank.)
      if (sync.handed_over()) comm.barrier();
    }
  }
  sync.wait();
  return bytes_of(dev, g.view());
}
}  // namespace

TEST_SUITE("emulated_handover") {
  TEST_CASE("hand-over or staging: chosen once from the transport's answer and the dtype") {
    run_loopback(2, [](LoopbackTransport& lt) {
      EmulatedDevice dev;
      for (bool takes : {true, false}) {
        DeviceLoopbackTransport t(lt, dev, takes);
        Communicator comm(t);
        Tensor g({10}, DType::f32, dev.allocator());
        BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 16);
        CHECK(sync.handed_over() == takes);
        CHECK(sync.staged() == !takes);
        if (takes) {
          CHECK(sync.bucket_algorithm(0) == AllreduceAlgorithm::ordered);
          CHECK(sync.bucket_algorithm_changes(0) == 0);
        }
        // 16-bit gradients: the policy converts them to an f32 accumulator (exec_converts_v).
        static_assert(exec_converts_v<EmulatedDevice>);
        Tensor h({10}, DType::bf16, dev.allocator());
        BasicGradientSync<EmulatedDevice> half(dev, comm, h.view(), 16);
        CHECK(half.handed_over() == takes);
        // Host gradients are neither.
        std::vector<float> host(10);
        GradientSync hs(comm, BufferView(span<float>(host)), 16);
        CHECK_FALSE(hs.handed_over());
        CHECK_FALSE(hs.staged());
        // Sharded updates: handed over too, refused with staged gradients, naming why.
        if (!takes)
          CHECK_THROWS_WITH_AS(sync.shard_updates(g.view()), doctest::Contains("host gradients"),
                               InvalidArgument);
      }
    });
  }

  TEST_CASE(
      "handed-over buckets: the staged path's bits, the host reference's, the ring's traffic") {
    for (int p : {1, 2, 3}) {
      CAPTURE(p);
      const std::size_t n = 37;  // buckets of 5 floats: parts of 1 or 2 elements, some empty
      const int steps = 4;
      std::vector<std::vector<std::vector<unsigned char>>> handed(p), staged(p);
      std::vector<std::size_t> sent(p);
      std::vector<char> modes(p);
      std::atomic<int> failures{0};
      run_loopback(p, [&](LoopbackTransport& lt) {
        const int r = lt.rank();
        try {
          EmulatedDevice dev;
          // Reproducible: the staged all-reduce sums in rank order, as the hand-over does.
          CommConfig c;
          c.timeout_s = 30;
          c.reproducible = true;
          for (bool takes : {true, false}) {
            DeviceLoopbackTransport t(lt, dev, takes);
            Communicator comm(t, c);
            Tensor g({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
            BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 20);
            if (takes) modes[r] = sync.handed_over();
            for (int s = 0; s < steps; ++s)
              (takes ? handed : staged)[r].push_back(handover_step(dev, sync, comm, g, r, s));
            if (takes)
              sent[r] = t.device_bytes_sent();
            else
              CHECK(t.device_bytes_sent() == 0);
          }
        } catch (const std::exception& e) {
          MESSAGE(std::string(e.what()));
          ++failures;
        }
      });
      REQUIRE(failures.load() == 0);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(modes[r]);
        for (int s = 0; s < steps; ++s) {
          CAPTURE(s);
          // Host reference: every rank's gradients summed in rank order in f32, divided by p.
          std::vector<float> want = handover_grads(0, s, n);
          for (int q = 1; q < p; ++q) {
            const std::vector<float> x = handover_grads(q, s, n);
            for (std::size_t i = 0; i < n; ++i) want[i] += x[i];
          }
          for (float& w : want) w /= static_cast<float>(p);
          std::vector<unsigned char> wb(n * sizeof(float));
          std::memcpy(wb.data(), want.data(), wb.size());
          CHECK(handed[r][s] == wb);
          CHECK(handed[r][s] == staged[r][s]);
        }
        // Each bucket: this rank's part to nobody but its owners and back: every element but
        // this rank's own part out once, its own part out p-1 times, per step.
        std::size_t want_sent = 0;
        for (std::size_t b0 = 0; b0 < n; b0 += 5) {
          const std::size_t len = n - b0 < 5 ? n - b0 : 5;
          const std::size_t own = partition_count(len, p, r);
          want_sent += (len - own) + own * static_cast<std::size_t>(p - 1);
        }
        CHECK(sent[r] == want_sent * sizeof(float) * steps);
      }
    }
  }

  TEST_CASE("a peer that never sends: TimeoutError naming the hand-over, the bucket and the peer") {
    std::atomic<int> caught{0};
    run_loopback(2, [&](LoopbackTransport& lt) {
      EmulatedDevice dev;
      DeviceLoopbackTransport t(lt, dev, true);
      CommConfig c;
      c.timeout_s = 0.3;
      Communicator comm(t, c);
      Tensor g({8}, DType::f32, dev.allocator());
      BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 64);
      if (lt.rank() == 1) return;  // rank 1 never takes part
      dev.fill(dev.compute_stream(), static_cast<float*>(g.view().data), 8, 1.0f);
      try {
        sync.sync_all();
      } catch (const TimeoutError& e) {
        const std::string m = e.what();
        CHECK(m.find("GradientSync hand-over") != std::string::npos);
        CHECK(m.find("bucket 0") != std::string::npos);
        CHECK(m.find("rank 1") != std::string::npos);
        ++caught;
      }
    });
    CHECK(caught.load() == 1);
  }
}
