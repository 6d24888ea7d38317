// The hand-over of device memory in every sync mode, on the emulated device: 16-bit gradient
// buckets, sharded steps (GradientSync::shard_updates) and fully sharded units
// (FullyShardedSync), each against its staged path and a host reference, bit for bit; the
// choice and its log line; no host staging and no stream synchronisation in the handed-over
// passes (the emulated device's memory faults on a host read).
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "support/device_loopback.hpp"
#include "support/emulated_device.hpp"
#include "support/fully_sharded.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/loopback.hpp>

using namespace dtrain;
using test::bytes_of;
using test::DeviceLoopbackTransport;
using test::EmulatedDevice;

namespace {

// Rank r's value i of step s: seeded, of mixed magnitudes so that the summation order shows.
float modes_value(int r, int s, std::size_t i) {
  const std::uint64_t h =
      (static_cast<std::uint64_t>(r) * 1000003u + static_cast<std::uint64_t>(s) * 7919u + i) *
      0x9E3779B97F4A7C15ull;
  const float u = static_cast<float>((h >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
  return u * (i % 3 == 0 ? 1e3f : 1e-3f);
}

std::vector<float> modes_floats(const std::vector<unsigned char>& b) {
  std::vector<float> v(b.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

void modes_upload(EmulatedDevice& dev, BufferView v, const void* src) {
  dev.copy_h2d(dev.compute_stream(), v.data, src, v.bytes());
  exec_synchronize(dev, dev.compute_stream(), 30, "test upload");
}

// Runs f with stderr (and rank 0's info lines) going to a file; returns what was written.
template <class F>
std::string modes_stderr(F&& f) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int saved = ::dup(2);
  ::dup2(::fileno(tmp), 2);
  const LogLevel level = log_level();
  set_log_level(LogLevel::info);
  std::exception_ptr err;
  try {
    f();
  } catch (...) {
    err = std::current_exception();
  }
  set_log_level(level);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string out;
  std::rewind(tmp);
  char buf[4096];
  std::size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, got);
  std::fclose(tmp);
  if (err) std::rethrow_exception(err);
  return out;
}

// The layers of the fully sharded runs (built-in layers, a residual block among them).
std::vector<LayerSpec> modes_layers() {
  return {Linear(6, 24), Tanh(),        Residual{Linear(24, 24), Gelu()},
          LayerNorm(24), Linear(24, 7), Relu(),
          Linear(7, 3)};
}
constexpr std::int64_t modes_rows = 5;
void modes_data(int rank, int step, int m, std::vector<float>& x, std::vector<float>& y) {
  x.resize(modes_rows * 6);
  y.resize(modes_rows * 3);
  const auto seed = static_cast<std::uint64_t>(rank * 1000 + step * 10 + m);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = test::hashed_value(seed, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = test::hashed_value(seed + 7, i);
}

// The emulated device without the optional convert(): 16-bit gradients cannot be reduced on it.
struct NoConvertDevice : EmulatedDevice {
  template <class... A>
  void convert(A...) = delete;
};
static_assert(exec_converts_v<EmulatedDevice> && !exec_converts_v<NoConvertDevice>);

CommConfig modes_config() {
  CommConfig c;
  c.timeout_s = 30;
  c.reproducible = true;  // the staged collectives sum in rank order, as the hand-over does
  return c;
}

}  // namespace

TEST_SUITE("emulated_handover_modes") {
  TEST_CASE("every mode hands device memory over or stages it, chosen once and logged") {
    std::atomic<int> failures{0};
    for (bool takes : {true, false}) {
      CAPTURE(takes);
      const std::string log = modes_stderr([&] {
        run_loopback(2, [&](LoopbackTransport& lt) {
          try {
            EmulatedDevice dev;
            DeviceLoopbackTransport t(lt, dev, takes);
            Communicator comm(t, modes_config());
            Tensor h({10}, DType::bf16, dev.allocator());
            BasicGradientSync<EmulatedDevice> sync16(dev, comm, h.view(), 16);
            CHECK(sync16.handed_over() == takes);
            CHECK(sync16.staged() == !takes);
            // Without convert() the policy cannot reduce 16-bit floats: staged, saying why.
            NoConvertDevice plain;
            Tensor h2({10}, DType::f16, plain.allocator());
            BasicGradientSync<NoConvertDevice> plain16(plain, comm, h2.view(), 16);
            CHECK(plain16.staged());
            using Model = BasicSequential<float, EmulatedDevice>;
            Model model(modes_layers(), dev);
            model.init(3);
            FullyShardedSync<Model> fs(comm, model);
            CHECK(fs.handed_over() == takes);
            CHECK(fs.staged() == !takes);
            CHECK((fs.staging_bytes() == 0) == takes);
            // Sharded steps: handed over, or refused with staged gradients, naming why.
            Tensor g({10}, DType::f32, dev.allocator()), p({10}, DType::f32, dev.allocator());
            BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 16);
            if (takes) {
              sync.shard_updates(p.view());
              CHECK(sync.sharded());
            } else {
              CHECK_THROWS_WITH_AS(sync.shard_updates(p.view()),
                                   doctest::Contains("staged through host memory"),
                                   InvalidArgument);
            }
          } catch (const std::exception& e) {
            MESSAGE(std::string(e.what()));
            ++failures;
          }
        });
      });
      REQUIRE(failures.load() == 0);
      // Rank 0 says which path each sync took and why, once at construction.
      const std::string how = takes ? "handed to the transport" : "staged through host memory";
      const std::string why =
          takes ? "the test transport takes them" : "the test transport was told to refuse";
      for (const char* who : {"GradientSync: cuda gradients ", "FullyShardedSync: cuda units "}) {
        CAPTURE(who);
        const std::size_t at = log.find(std::string("dtrain[rank 0] info: ") + who + how);
        REQUIRE(at != std::string::npos);
        CHECK(log.find(why, at) < log.find('\n', at));
      }
      if (takes)
        CHECK(log.find("dtrain[rank 0] info: GradientSync: cuda gradients staged through host "
                       "memory (f16 needs an f32 accumulator and the execution policy has no "
                       "convert())") != std::string::npos);
      CHECK(log.find("dtrain[rank 1] info") == std::string::npos);
    }
  }

  TEST_CASE("16-bit buckets handed over: widened once, summed in f32 in rank order, rounded once") {
    for (DType dt : {DType::f16, DType::bf16}) {
      for (int p : {1, 2, 3}) {
        CAPTURE(name_of(dt));
        CAPTURE(p);
        const std::size_t n = 37;  // buckets of 5 elements: parts of 1 or 2, some empty
        const int steps = 2;
        // 16-bit inputs of rank r, step s.
        auto input = [&](int r, int s) {
          std::vector<std::uint16_t> v(n);
          for (std::size_t i = 0; i < n; ++i) {
            const float f = modes_value(r, s, i);
            v[i] = dt == DType::f16 ? dtrain::half(f).bits : dtrain::bfloat16(f).bits;
          }
          return v;
        };
        auto widen = [&](std::uint16_t b) {
          dtrain::half h;
          dtrain::bfloat16 bf;
          h.bits = b;
          bf.bits = b;
          return dt == DType::f16 ? static_cast<float>(h) : static_cast<float>(bf);
        };
        std::vector<std::vector<std::vector<unsigned char>>> handed(p), staged(p);
        std::vector<std::size_t> sent(p);
        std::atomic<int> failures{0};
        run_loopback(p, [&](LoopbackTransport& lt) {
          const int r = lt.rank();
          try {
            EmulatedDevice dev;
            for (bool takes : {true, false}) {
              DeviceLoopbackTransport t(lt, dev, takes);
              Communicator comm(t, modes_config());
              Tensor g({static_cast<std::int64_t>(n)}, dt, dev.allocator());
              BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 10);
              REQUIRE(sync.handed_over() == takes);
              for (int s = 0; s < steps; ++s) {
                const std::vector<std::uint16_t> h = input(r, s);
                modes_upload(dev, g.view(), h.data());
                sync.ready(n / 2, n - n / 2);
                sync.ready(0, n / 2);
                sync.wait();
                (takes ? handed : staged)[r].push_back(bytes_of(dev, g.view()));
              }
              if (takes) sent[r] = t.device_bytes_sent();
            }
          } catch (const std::exception& e) {
            MESSAGE(std::string(e.what()));
            ++failures;
          }
        });
        REQUIRE(failures.load() == 0);
        for (int s = 0; s < steps; ++s) {
          CAPTURE(s);
          // Host reference: each rank's value widened, summed in f32 in rank order, divided by p
          // in f32, rounded once.
          std::vector<std::uint16_t> want(n);
          for (std::size_t i = 0; i < n; ++i) {
            float acc = widen(input(0, s)[i]);
            for (int q = 1; q < p; ++q) acc += widen(input(q, s)[i]);
            acc /= static_cast<float>(p);
            want[i] = dt == DType::f16 ? dtrain::half(acc).bits : dtrain::bfloat16(acc).bits;
          }
          std::vector<unsigned char> wb(n * 2);
          std::memcpy(wb.data(), want.data(), wb.size());
          for (int r = 0; r < p; ++r) {
            CAPTURE(r);
            CHECK(handed[r][s] == wb);
            CHECK(handed[r][s] == staged[r][s]);
          }
        }
        // The device bytes of the parts and averages, as for 32-bit buckets: 2 bytes each.
        for (int r = 0; r < p; ++r) {
          std::size_t want_sent = 0;
          for (std::size_t b0 = 0; b0 < n; b0 += 5) {
            const std::size_t len = n - b0 < 5 ? n - b0 : 5;
            const std::size_t own = partition_count(len, p, r);
            want_sent += (len - own) + own * static_cast<std::size_t>(p - 1);
          }
          CHECK(sent[r] == want_sent * 2 * steps);
        }
      }
    }
  }

  TEST_CASE("sharded steps handed over: the replicated and the host sharded step's bits") {
    for (int p : {2, 3}) {
      CAPTURE(p);
      const std::size_t n = 37;
      const int steps = 3;
      // Per rank: parameters after the steps, and the optimizer state made whole again.
      struct Result {
        std::vector<unsigned char> params, state;
        std::uint64_t syncs = 0;
      };
      std::vector<Result> sharded(p), replicated(p), host(p);
      std::atomic<int> failures{0};
      std::vector<float> init(n);
      for (std::size_t i = 0; i < n; ++i) init[i] = modes_value(9, 0, i) * 1e-2f;
      run_loopback(p, [&](LoopbackTransport& lt) {
        const int r = lt.rank();
        try {
          for (int mode = 0; mode < 2; ++mode) {  // device: sharded, replicated
            EmulatedDevice dev;
            DeviceLoopbackTransport t(lt, dev, true);
            Communicator comm(t, modes_config());
            const auto count = static_cast<std::int64_t>(n);
            Tensor w({count}, DType::f32, dev.allocator()), g({count}, DType::f32, dev.allocator());
            modes_upload(dev, w.view(), init.data());
            BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 20);
            REQUIRE(sync.handed_over());
            BasicAdamW<EmulatedDevice> opt(dev, w.view(), g.view(), Schedule::constant(0.01));
            if (mode == 0) sync.shard_updates(w.view(), opt);
            Result& res = (mode == 0 ? sharded : replicated)[r];
            for (int s = 0; s < steps; ++s) {
              std::vector<float> h(n);
              for (std::size_t i = 0; i < n; ++i) h[i] = modes_value(r, s, i);
              modes_upload(dev, g.view(), h.data());
              sync.ready(n / 2, n - n / 2);
              sync.ready(0, n / 2);
              const std::uint64_t before = dev.stream_synchronizations();
              if (mode == 0) {
                sync.wait(opt);
              } else {
                sync.wait();
                opt.step();
              }
              res.syncs += dev.stream_synchronizations() - before;
            }
            res.params = bytes_of(dev, w.view());
            if (mode == 0) {
              CHECK(opt.state_partial());
              sync.gather_state(opt);
              CHECK_FALSE(opt.state_partial());
            }
            opt.for_each_state_arena([&](BufferView v) {
              const auto b = bytes_of(dev, v);
              res.state.insert(res.state.end(), b.begin(), b.end());
            });
          }
          {  // host: the communicator's sharded step
            Communicator comm(lt, modes_config());
            std::vector<float> w = init, g(n);
            GradientSync sync(comm, BufferView(span<float>(g)), 20);
            AdamW opt(BufferView(span<float>(w)), BufferView(span<float>(g)),
                      Schedule::constant(0.01));
            sync.shard_updates(BufferView(span<float>(w)), opt);
            for (int s = 0; s < steps; ++s) {
              for (std::size_t i = 0; i < n; ++i) g[i] = modes_value(r, s, i);
              sync.ready_all();
              sync.wait(opt);
            }
            host[r].params = bytes_of(BufferView(span<float>(w)));
            sync.gather_state(opt);
            opt.for_each_state_arena([&](BufferView v) {
              const auto b = bytes_of(v);
              host[r].state.insert(host[r].state.end(), b.begin(), b.end());
            });
          }
        } catch (const std::exception& e) {
          MESSAGE(std::string(e.what()));
          ++failures;
        }
      });
      REQUIRE(failures.load() == 0);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(sharded[r].params == replicated[r].params);
        CHECK(sharded[r].params == host[r].params);
        CHECK(sharded[r].state == replicated[r].state);
        CHECK(sharded[r].state == host[r].state);
        CHECK(sharded[r].params == sharded[0].params);
        // Event-ordered: the steps wait for the reductions and updates on events only.
        CHECK(sharded[r].syncs == 0u);
      }
    }
  }

  TEST_CASE(
      "fully sharded units handed over: the staged path's bits, the host step's, no staging") {
    struct Case {
      int ranks, buffers, micro;
    };
    for (const Case& k : {Case{2, 2, 1}, Case{3, 1, 1}, Case{2, 1, 2}, Case{3, 2, 2}}) {
      CAPTURE(k.ranks);
      CAPTURE(k.buffers);
      CAPTURE(k.micro);
      const int steps = 2;
      struct Result {
        std::vector<float> params;  // this rank's parts (device runs) or the whole arena (host)
        StateParts parts;
        std::uint64_t pass_syncs = 0;
        std::size_t sent = 0;
      };
      std::vector<Result> handed(k.ranks), staged(k.ranks), host(k.ranks);
      std::atomic<int> failures{0};
      run_loopback(k.ranks, [&](LoopbackTransport& lt) {
        const int r = lt.rank();
        try {
          for (bool takes : {true, false}) {
            EmulatedDevice dev;
            DeviceLoopbackTransport t(lt, dev, takes);
            Communicator comm(t, modes_config());
            using Model = BasicSequential<float, EmulatedDevice>;
            Model model(modes_layers(), dev);
            model.init(11);
            FullyShardedOptions o;
            o.buffers = k.buffers;
            FullyShardedSync<Model> fs(comm, model, o);
            REQUIRE(fs.handed_over() == takes);
            BasicAdamW<EmulatedDevice> opt(model, Schedule::constant(0.01));
            Result& res = (takes ? handed : staged)[r];
            std::vector<float> x, y;
            for (int s = 0; s < steps; ++s) {
              model.zero_grad();
              const std::uint64_t before = dev.stream_synchronizations();
              for (int m = 0; m < k.micro; ++m) {
                modes_data(r, s, m, x, y);
                PassOptions pass;
                pass.loss_scale = 1.0 / k.micro;
                model.forward_backward(x.data(), y.data(), modes_rows, Loss::mse, {}, pass);
              }
              res.pass_syncs += dev.stream_synchronizations() - before;
              fs.wait(opt);
            }
            res.params = modes_floats(bytes_of(dev, model.parameters()));
            res.parts = model.arena_parts();
            res.sent = t.device_bytes_sent();
          }
          {  // host, replicated: the whole arena
            Communicator comm(lt, modes_config());
            Sequential model(modes_layers());
            model.init(11);
            GradientSync sync(comm, model.gradients(), 256);
            AdamW opt(model, Schedule::constant(0.01));
            std::vector<float> x, y;
            for (int s = 0; s < steps; ++s) {
              model.zero_grad();
              for (int m = 0; m < k.micro; ++m) {
                modes_data(r, s, m, x, y);
                PassOptions pass;
                pass.loss_scale = 1.0 / k.micro;
                auto ready = [&](std::size_t off, std::size_t c) {
                  if (m + 1 == k.micro) sync.ready(off, c);
                };
                model.forward_backward(x.data(), y.data(), modes_rows, Loss::mse, ready, pass);
              }
              sync.wait();
              opt.step();
            }
            host[r].params = modes_floats(bytes_of(model.parameters()));
          }
        } catch (const std::exception& e) {
          MESSAGE(std::string(e.what()));
          ++failures;
        }
      });
      REQUIRE(failures.load() == 0);
      for (int r = 0; r < k.ranks; ++r) {
        CAPTURE(r);
        const Result& a = handed[r];
        const Result& b = staged[r];
        REQUIRE(a.parts == b.parts);
        CHECK(test::same_bits(a.params, b.params));
        const std::vector<float> want = test::pick(host[r].params, a.parts);
        if (k.micro == 1) {
          CHECK(test::same_bits(a.params, want));
        } else {  // accumulated passes: averaged per pass and added, to rounding
          REQUIRE(want.size() == a.params.size());
          for (std::size_t i = 0; i < want.size(); ++i)
            REQUIRE(std::fabs(want[i] - a.params[i]) <= 1e-5f * (1 + std::fabs(want[i])));
        }
        // No host copy of the parts to refresh: the handed-over passes never synchronise a
        // stream; the staged ones do once per forward.
        CHECK(a.pass_syncs == 0u);
        CHECK(b.pass_syncs == static_cast<std::uint64_t>(steps * k.micro));
        CHECK(a.sent > 0u);
        CHECK(b.sent == 0u);
      }
    }
  }
  TEST_CASE("a fully sharded peer that never sends: TimeoutError naming the unit and the peer") {
    std::atomic<int> caught{0};
    run_loopback(2, [&](LoopbackTransport& lt) {
      EmulatedDevice dev;
      DeviceLoopbackTransport t(lt, dev, true);
      CommConfig c = modes_config();
      c.timeout_s = 0.2;
      Communicator comm(t, c);
      using Model = BasicSequential<float, EmulatedDevice>;
      Model model(modes_layers(), dev);
      model.init(5);
      FullyShardedOptions o;
      o.prefetch = false;  // one gather in flight: the one that times out
      FullyShardedSync<Model> fs(comm, model, o);
      if (lt.rank() == 1) return;  // rank 1 never takes part
      std::vector<float> x, y;
      modes_data(0, 0, 0, x, y);
      try {
        model.forward_backward(x.data(), y.data(), modes_rows, Loss::mse);
      } catch (const TimeoutError& e) {
        const std::string m = e.what();
        CHECK(m.find("FullyShardedSync hand-over") != std::string::npos);
        CHECK(m.find("unit 0") != std::string::npos);
        CHECK(m.find("all-gather round: receive from rank 1") != std::string::npos);
        ++caught;
      }
    });
    CHECK(caught.load() == 1);
  }
}
