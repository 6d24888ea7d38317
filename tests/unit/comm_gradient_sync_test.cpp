// GradientSync over loopback: equals a plain averaging all-reduce, and buckets start (and
// finish) before wait().
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/transports/loopback.hpp>

using namespace dtrain;

TEST_CASE("GradientSync equals allreduce(avg) and overlaps with backward") {
  for (int p : {1, 2, 3}) {
    CAPTURE(p);
    std::atomic<int> bad{0}, overlapped{0};
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c;
      c.timeout_s = 30;
      c.progress = CommProgress::thread;  // the overlap this test checks
      Communicator comm(t, c);
      const std::size_t n = 10007;  // 4 layers of uneven sizes
      const std::size_t layer[4] = {3000, 4000, 7, 3000};
      std::vector<float> grads(n), ref(n);
      GradientSync sync(comm, BufferView(span<float>(grads)), 4096 /* 1024 floats */);
      CHECK(sync.bucket_count() == 10);
      CHECK(sync.bucket_range(0).first + sync.bucket_range(0).second == n);
      for (int step = 0; step < 3; ++step) {
        for (std::size_t i = 0; i < n; ++i)
          grads[i] =
              static_cast<float>((t.rank() + 1) * (step + 1)) * 0.25f + static_cast<float>(i % 11);
        ref = grads;
        comm.allreduce(BufferView(span<float>(ref)), ReduceOp::avg, AllreduceAlgorithm::ring);
        // "Backward": layers from the end of the arena towards the start.
        std::size_t end = n;
        for (int l = 3; l >= 0; --l) {
          const std::size_t begin = end - layer[l];
          sync.ready(begin, layer[l]);
          end = begin;
          if (l == 3) {
            // The last layer's 3000 elements fill buckets 0 and 1 (2048 elements): they must
            // have started, and finish on the progress thread while "backward" continues.
            CHECK(sync.buckets_started() == 2);
            const double t0 = now_seconds();
            bool done = false;
            while (!(done = sync.bucket_done(0)) && now_seconds() - t0 < 10)
              std::this_thread::sleep_for(std::chrono::microseconds(200));
            if (done || p == 1) ++overlapped;
          }
        }
        CHECK(end == 0);
        sync.wait();
        for (std::size_t i = 0; i < n; ++i)
          if (grads[i] != ref[i]) ++bad;
      }
      // sync_all for code without overlap; reporting twice is an error.
      for (std::size_t i = 0; i < n; ++i) grads[i] = static_cast<float>(t.rank());
      sync.sync_all();
      if (grads[5] != static_cast<float>(p - 1) / 2) ++bad;
      sync.ready(0, 10);
      CHECK_THROWS_AS(sync.ready(0, n), InvalidArgument);  // elements 0..9 twice
      sync.ready_all();
      sync.wait();
    });
    CHECK(bad.load() == 0);
    CHECK(overlapped.load() == 3 * p);
  }
}

TEST_CASE(
    "GradientSync::wait(opt) updates each bucket once, after its average, then ends the step") {
  for (int p : {1, 2}) {
    CAPTURE(p);
    std::atomic<int> bad{0};
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c;
      c.timeout_s = 30;
      Communicator comm(t, c);
      const std::size_t n = 3000;
      std::vector<float> grads(n);
      GradientSync sync(comm, BufferView(span<float>(grads)), 4096 /* 1024 floats */,
                        AllreduceAlgorithm::ring);
      // Records the ranges it is given and whether each already held the average.
      struct Recorder {
        std::vector<float>* grads;
        float expect;
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
        int averaged = 0, steps = 0;
        void update(std::size_t off, std::size_t cnt) {
          ranges.emplace_back(off, cnt);
          bool ok = true;
          for (std::size_t i = off; i < off + cnt; ++i) ok &= (*grads)[i] == expect;
          averaged += ok ? 1 : 0;
        }
        void complete_step() { ++steps; }
      } rec{&grads, static_cast<float>(p - 1) / 2, {}, 0, 0};
      for (auto& g : grads) g = static_cast<float>(t.rank());
      sync.ready(0, n);
      sync.wait(rec);
      if (rec.steps != 1 || rec.averaged != 3 || rec.ranges.size() != 3) ++bad;
      // Bucket order: the end of the arena first, together covering it once.
      std::size_t end = n;
      for (const auto& r : rec.ranges) {
        if (r.first + r.second != end) ++bad;
        end = r.first;
      }
      if (end != 0) ++bad;
      // A step with unreported elements throws and does not complete the optimizer's step.
      sync.ready(n - 10, 10);
      CHECK_THROWS_AS(sync.wait(rec), InvalidArgument);
      if (rec.steps != 1) ++bad;
      sync.sync_all();
    });
    CHECK(bad.load() == 0);
  }
}
