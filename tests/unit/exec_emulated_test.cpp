// Execution policies: the generic model, optimizers and gradient sync on the emulated device
// (tests/support/emulated_device.hpp) give HostExec's bits, and the emulation catches what a GPU
// would punish: a missing synchronisation, a host dereference of device memory, a copy in the
// wrong direction. The emulated device runs HostExec's own kernels, so equal bits are what the
// generic code around the kernels must give: every operand copied to and from device memory, every
// wait in place (a lazy stream leaves stale data otherwise), no host read of device memory. The
// device kernels' arithmetic is not checked here (tests/gpu against host references, and the GPU's
// functors in exec_emulated_layers_test.cpp against float64 finite differences).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/emulated_device.hpp"
#include "support/memory_state.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_exec_emulated_test {

using namespace dtrain;
using test::bytes_of;
using test::EmulatedDevice;

namespace {

using DevModel = BasicSequential<float, EmulatedDevice>;

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  RngStream rng(seed, 11);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform_double());
  return v;
}

std::vector<LayerSpec> mixed_layers() {
  return {Linear(12, 32), Gelu(), LayerNorm(32), Dropout(0.25f),
          Linear(32, 16), Tanh(), Linear(16, 5)};
}

struct Data {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::vector<std::int64_t> ids;
};
Data make_data(std::int64_t rows, std::int64_t in, std::int32_t classes, std::uint64_t seed) {
  Data d;
  d.x = random_floats(static_cast<std::size_t>(rows * in), seed, -2, 2);
  for (std::int64_t r = 0; r < rows; ++r) {
    d.y.push_back(static_cast<std::int32_t>((r * 7 + static_cast<std::int64_t>(seed)) % classes));
    d.ids.push_back(1000 + 3 * r + static_cast<std::int64_t>(seed));
  }
  return d;
}

// A loader-style batch (features, labels, indices, size) in host memory.
struct HostBatch {
  Tensor features, labels;
  std::vector<std::int64_t> indices;
  std::size_t size = 0;
};
HostBatch to_batch(const Data& d, std::int64_t rows, std::int64_t in) {
  HostBatch b;
  b.size = static_cast<std::size_t>(rows);
  b.features = Tensor({rows, in}, DType::f32);
  b.labels = Tensor({rows}, DType::i32);
  std::memcpy(b.features.raw(), d.x.data(), d.x.size() * sizeof(float));
  std::memcpy(b.labels.raw(), d.y.data(), d.y.size() * sizeof(std::int32_t));
  b.indices = d.ids;
  return b;
}

}  // namespace

TEST_SUITE("emulated_model") {
  TEST_CASE(
      "forward, backward and losses through device memory and lazy streams keep HostExec's bits "
      "(the same kernels on both sides)") {
    for (bool lazy : {true, false}) {
      CAPTURE(lazy);
      EmulatedDevice::Options o;
      o.lazy = lazy;
      EmulatedDevice dev(o);
      Sequential host(mixed_layers());
      DevModel model(mixed_layers(), dev);
      host.init(42);
      model.init(42);
      CHECK(model.parameters().space == Space::cuda);
      CHECK(bytes_of(dev, model.parameters()) == bytes_of(host.parameters()));
      const std::int64_t rows = 9;
      const Data d = make_data(rows, 12, 5, 3);
      PassOptions opt;
      opt.step = 4;
      opt.sample_ids = d.ids.data();
      // Softmax cross-entropy, MSE on one-hot labels and MSE on real targets, accumulating.
      const auto targets = random_floats(static_cast<std::size_t>(rows * 5), 8);
      std::vector<double> lh, ld;
      lh.push_back(host.forward_backward(d.x.data(), d.y.data(), rows, Loss::softmax_cross_entropy,
                                         {}, opt));
      auto p1 = model.forward_backward(d.x.data(), d.y.data(), rows, Loss::softmax_cross_entropy,
                                       {}, opt);
      lh.push_back(host.forward_backward(d.x.data(), d.y.data(), rows, Loss::mse, {}, opt));
      auto p2 = model.forward_backward(d.x.data(), d.y.data(), rows, Loss::mse, {}, opt);
      lh.push_back(host.forward_backward(d.x.data(), targets.data(), rows, Loss::mse));
      auto p3 = model.forward_backward(d.x.data(), targets.data(), rows, Loss::mse);
      ld = {p1.get(), p2.get(), p3.get()};
      CHECK(lh == ld);
      CHECK(bytes_of(dev, model.gradients()) == bytes_of(host.gradients()));
      // Evaluation on the device: output, argmax and accuracy as on the host.
      std::vector<float> out_h(static_cast<std::size_t>(rows * 5)), out_d(out_h.size());
      PassOptions eval;
      eval.training = false;
      host.forward(d.x.data(), rows, eval);
      host.copy_output(out_h.data());
      model.forward(d.x.data(), rows, eval);
      model.copy_output(out_d.data());
      CHECK(std::memcmp(out_h.data(), out_d.data(), out_h.size() * sizeof(float)) == 0);
      CHECK(model.count_correct(d.x.data(), d.y.data(), rows) ==
            host.count_correct(d.x.data(), d.y.data(), rows));
      // The batch form follows the batch's dataset indices, like the raw form given them.
      HostBatch b = to_batch(d, rows, 12);
      model.zero_grad();
      host.zero_grad();
      PassOptions step;
      step.step = 4;
      CHECK(model.forward_backward(b, {}, Loss::softmax_cross_entropy, step).get() == lh[0]);
      CHECK(host.forward_backward(b, {}, Loss::softmax_cross_entropy, step) == lh[0]);
      CHECK(bytes_of(dev, model.gradients()) == bytes_of(host.gradients()));
    }
  }

  TEST_CASE(
      "a float64 model through device memory keeps the host model's bits (the same kernels)") {
    EmulatedDevice dev;
    const std::vector<LayerSpec> layers{Linear(4, 6), Gelu(), LayerNorm(6), Linear(6, 3)};
    BasicSequential<double> host(layers);
    BasicSequential<double, EmulatedDevice> model(layers, dev);
    host.init(7);
    model.init(7);
    std::vector<double> x{0.5, -1, 2, 0.25, 1, 1, -0.5, 0.75};
    const std::int32_t y[] = {2, 0};
    const double lh = host.forward_backward(x.data(), y, 2);
    CHECK(model.forward_backward(x.data(), y, 2).get() == lh);
    CHECK(bytes_of(dev, model.gradients()) == bytes_of(host.gradients()));
  }

  TEST_CASE(
      "training through device memory and streams keeps host training's bits (the same kernels)") {
    EmulatedDevice dev;
    Sequential host(mixed_layers());
    DevModel model(mixed_layers(), dev);
    host.init(9);
    model.init(9);
    AdamW host_opt(host, Schedule::warmup_cosine(0.01, 2, 10));
    BasicAdamW<EmulatedDevice> dev_opt(model, Schedule::warmup_cosine(0.01, 2, 10));
    std::vector<double> lh, ld;
    std::vector<PendingLoss<EmulatedDevice>> pending;
    for (int s = 0; s < 6; ++s) {
      const Data d = make_data(8, 12, 5, static_cast<std::uint64_t>(s));
      PassOptions opt;
      opt.step = s;
      opt.sample_offset = 8 * s;
      host.zero_grad();
      lh.push_back(
          host.forward_backward(d.x.data(), d.y.data(), 8, Loss::softmax_cross_entropy, {}, opt));
      host_opt.step();
      model.zero_grad();
      // The loss stays on the device until read: read all of them after the loop.
      pending.push_back(
          model.forward_backward(d.x.data(), d.y.data(), 8, Loss::softmax_cross_entropy, {}, opt));
      dev_opt.step();
    }
    for (auto& p : pending) ld.push_back(p.get());
    CHECK(lh == ld);
    CHECK(bytes_of(dev, model.parameters()) == bytes_of(host.parameters()));
    CHECK(bytes_of(dev, dev_opt.exp_avg()) == bytes_of(host_opt.exp_avg()));
    CHECK(bytes_of(dev, dev_opt.exp_avg_sq()) == bytes_of(host_opt.exp_avg_sq()));
    // Learning happened at all (the comparison is not between two untouched models).
    CHECK(lh.back() < lh.front());
  }
}

TEST_SUITE("emulated_model") {
  TEST_CASE("model and optimizer state saved on the device restore on the host, and back") {
    EmulatedDevice dev;
    Sequential host(mixed_layers());
    DevModel model(mixed_layers(), dev);
    model.init(3);
    BasicAdamW<EmulatedDevice> dev_opt(model, 0.01);
    const Data d = make_data(8, 12, 5, 1);
    for (int s = 0; s < 2; ++s) {
      model.zero_grad();
      model.forward_backward(d.x.data(), d.y.data(), 8);
      dev_opt.step();
    }
    // Save from the device (the visitor reads host memory only), restore on the host.
    test::MemoryState saved;
    saved.child("model", model);
    saved.child("optimizer", dev_opt);
    AdamW host_opt(host, 0.01);
    saved.load = true;
    saved.child("model", host);
    saved.child("optimizer", host_opt);
    CHECK(host_opt.step_count() == 2);
    CHECK(bytes_of(host.parameters()) == bytes_of(dev, model.parameters()));
    CHECK(bytes_of(host_opt.exp_avg_sq()) == bytes_of(dev, dev_opt.exp_avg_sq()));
    // Train on the host, save there, restore onto a fresh device model: same bits again.
    host.zero_grad();
    host.forward_backward(d.x.data(), d.y.data(), 8);
    host_opt.step();
    test::MemoryState again;
    again.child("model", host);
    again.child("optimizer", host_opt);
    EmulatedDevice dev2;
    DevModel fresh(mixed_layers(), dev2);
    BasicAdamW<EmulatedDevice> fresh_opt(fresh, 0.01);
    again.load = true;
    again.child("model", fresh);
    again.child("optimizer", fresh_opt);
    CHECK(bytes_of(dev2, fresh.parameters()) == bytes_of(host.parameters()));
    CHECK(bytes_of(dev2, fresh_opt.exp_avg()) == bytes_of(host_opt.exp_avg()));
    CHECK(fresh.step_count() == host.step_count());
  }
}

TEST_SUITE("emulated_optim") {
  TEST_CASE("gradient clipping of device gradients equals the host clip") {
    EmulatedDevice dev;
    Sequential host(mixed_layers());
    DevModel model(mixed_layers(), dev);
    host.init(4);
    model.init(4);
    const Data d = make_data(8, 12, 5, 3);
    host.zero_grad();
    host.forward_backward(d.x.data(), d.y.data(), 8);
    model.zero_grad();
    model.forward_backward(d.x.data(), d.y.data(), 8);
    GradNormClipper<EmulatedDevice> clip(dev);
    // The clipper's sum of squares is queued behind the backward pass: no host wait before it.
    const double dn = clip(model.gradients(), 0.05);
    const double hn = clip_grad_norm(host.gradients(), 0.05);
    CHECK(hn > 0.05);  // the bound is active
    CHECK(dn == hn);
    const auto clipped = bytes_of(dev, model.gradients());
    CHECK(clipped == bytes_of(host.gradients()));
    // Independent reference: the norm of the clipped gradients is the bound.
    const auto g = host.gradients().as<float>("test");
    double sq = 0;
    for (float v : g) sq += static_cast<double>(v) * v;
    CHECK(std::sqrt(sq) == doctest::Approx(0.05).epsilon(1e-5));
    // A bound above the norm changes nothing; the HostExec clipper equals the free function.
    CHECK(clip(model.gradients(), 10.0) == doctest::Approx(0.05).epsilon(1e-5));
    CHECK(bytes_of(dev, model.gradients()) == clipped);
    HostExec hexec;
    CHECK(clip_grad_norm(hexec, host.gradients(), 0.01) > 0.04);
    Sequential again(mixed_layers());
    again.init(4);
    again.zero_grad();
    again.forward_backward(d.x.data(), d.y.data(), 8);
    clip_grad_norm(again.gradients(), 0.05);
    clip_grad_norm(again.gradients(), 0.01);
    CHECK(bytes_of(again.gradients()) == bytes_of(host.gradients()));
    // Device gradients are refused by the host form, naming the remedy.
    CHECK_THROWS_WITH_AS(clip_grad_norm(model.gradients(), 1.0),
                         doctest::Contains("GradNormClipper"), InvalidArgument);
  }

  TEST_CASE_TEMPLATE("optimizers on the emulated device equal HostExec; range updates equal step",
                     Opt, BasicSgd<EmulatedDevice>, BasicAdamW<EmulatedDevice>) {
    constexpr bool is_sgd = std::is_same_v<Opt, BasicSgd<EmulatedDevice>>;
    using HostOpt = std::conditional_t<is_sgd, Sgd, AdamW>;
    using Options = std::conditional_t<is_sgd, SgdOptions, AdamWOptions>;
    Options options{};
    if constexpr (is_sgd) options = SgdOptions{0.9, 0.1, 1e-3, false};
    const std::size_t n = 1500;
    const auto p0 = random_floats(n, 1), g0 = random_floats(n, 2);
    EmulatedDevice dev;
    Tensor pd({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
    Tensor gd({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
    dev.copy_h2d(dev.compute_stream(), pd.raw(), p0.data(), n * sizeof(float));
    dev.copy_h2d(dev.compute_stream(), gd.raw(), g0.data(), n * sizeof(float));
    std::vector<float> ph = p0, gh = g0, pr = p0;
    HostOpt whole(BufferView(span<float>(ph)), BufferView(span<float>(gh)), 0.05, options);
    HostOpt parts(BufferView(span<float>(pr)), BufferView(span<float>(gh)), 0.05, options);
    Opt device(dev, pd.view(), gd.view(), 0.05, options);
    for (int s = 0; s < 3; ++s) {
      whole.step();
      device.step();
      // Uneven ranges in reverse order, as gradient buckets arrive.
      parts.update(1000, 500);
      parts.update(7, 993);
      parts.update(0, 7);
      parts.complete_step();
    }
    CHECK(device.step_count() == 3);
    CHECK(bytes_of(dev, pd.view()) == bytes_of(BufferView(span<float>(ph))));
    CHECK(std::memcmp(pr.data(), ph.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(ph.data(), p0.data(), n * sizeof(float)) != 0);
    CHECK_THROWS_AS(parts.update(1000, 501), InvalidArgument);
    // A host arena is refused by the device optimizer, naming both spaces.
    CHECK_THROWS_WITH_AS(Opt(dev, BufferView(span<float>(ph)), BufferView(span<float>(gh)), 0.1),
                         doctest::Contains("cuda"), InvalidArgument);
  }
}

namespace {
// One loopback rank: trains `steps` steps of a model on `Exec` with a gradient sync, either
// waiting and stepping separately or fused (wait(opt)); returns parameters and losses.
template <class Exec>
void train_rank(Exec& exec, LoopbackTransport& t, bool fused, int steps,
                std::vector<unsigned char>& params, std::vector<double>& losses,
                std::vector<unsigned char>& grads, bool& staged) {
  CommConfig c;
  c.timeout_s = 30;
  Communicator comm(t, c);
  BasicSequential<float, Exec> model(mixed_layers(), exec);
  model.init(5);
  BasicSgd<Exec> opt(model, 0.05, SgdOptions{0.9, 0.0, 1e-4, true});
  BasicGradientSync<Exec> sync(exec, comm, model.gradients(), 1024 /* 256 floats */,
                               AllreduceAlgorithm::ring);
  staged = sync.staged();
  for (int s = 0; s < steps; ++s) {
    const Data d = make_data(6, 12, 5, static_cast<std::uint64_t>(10 * s + t.rank()));
    HostBatch b = to_batch(d, 6, 12);
    PassOptions o;
    o.step = s;
    model.zero_grad();
    losses.push_back(model.forward_backward(b, sync, Loss::softmax_cross_entropy, o));
    if (fused) {
      sync.wait(opt);
    } else {
      sync.wait();
      if (s + 1 == steps) {  // the averaged gradients of the last step, before the update
        if constexpr (std::is_same_v<Exec, HostExec>)
          grads = bytes_of(model.gradients());
        else
          grads = bytes_of(exec, model.gradients());
      }
      opt.step();
    }
  }
  if constexpr (std::is_same_v<Exec, HostExec>)
    params = bytes_of(model.parameters());
  else
    params = bytes_of(exec, model.parameters());
}
}  // namespace

TEST_SUITE("emulated_sync") {
  TEST_CASE("gradient sync of device buffers over loopback ranks equals the host run") {
    for (int p : {1, 2, 3}) {
      CAPTURE(p);
      const int steps = 3;
      std::vector<std::vector<unsigned char>> hp(p), dp(p), fp(p), hfp(p), hg(p), dg(p), unused(p);
      std::vector<std::vector<double>> hl(p), dl(p), fl(p), hfl(p);
      std::vector<char> staged(p, 0);
      std::atomic<int> failures{0};
      auto guard = [&](auto&& fn) {
        try {
          fn();
        } catch (const std::exception& e) {
          MESSAGE(e.what());
          ++failures;
        }
      };
      run_loopback(p, [&](LoopbackTransport& t) {
        const int r = t.rank();
        bool st = false;
        guard([&] { train_rank(HostExec::instance(), t, false, steps, hp[r], hl[r], hg[r], st); });
        guard([&] {
          HostExec host;
          train_rank(host, t, true, steps, hfp[r], hfl[r], unused[r], st);
        });
        guard([&] {
          EmulatedDevice dev;
          train_rank(dev, t, false, steps, dp[r], dl[r], dg[r], st);
          staged[r] = st;
        });
        guard([&] {
          EmulatedDevice::Options o;
          o.lazy = false;
          EmulatedDevice dev(o);
          train_rank(dev, t, true, steps, fp[r], fl[r], unused[r], st);
        });
      });
      REQUIRE(failures.load() == 0);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(staged[r]);  // loopback cannot reach device memory: buckets go through the host
        CHECK(dg[r] == hg[r]);
        CHECK(dl[r] == hl[r]);
        CHECK(dp[r] == hp[r]);
        CHECK(fl[r] == hl[r]);
        CHECK(fp[r] == hp[r]);   // fused on the device
        CHECK(hfp[r] == hp[r]);  // fused on the host
        CHECK(dp[r] == dp[0]);   // replicas agree
      }
    }
  }
}

TEST_SUITE("emulated_negative") {
  TEST_CASE("a missing synchronisation reads stale data; waiting reads the result") {
    EmulatedDevice dev;
    DevModel model({Linear(3, 4), Relu(), Linear(4, 2)}, dev);
    model.init(1);
    const float x[] = {1, 2, 3, -1, 0.5f, 2};
    const std::int32_t y[] = {0, 1};
    auto loss = model.forward_backward(x, y, 2);
    // Nothing has waited yet: the pass is still queued and the loss has not reached the host.
    CHECK(dev.pending(dev.compute_stream()) > 0);
    CHECK_FALSE(loss.ready());
    // A download without a wait leaves the host buffer as it was ...
    std::vector<float> g(model.parameter_count(), -7.0f);
    dev.copy_d2h(dev.compute_stream(), g.data(), model.gradients().data, model.gradients().bytes());
    CHECK(g[0] == -7.0f);
    // ... until the host waits for it.
    exec_synchronize(dev, dev.compute_stream(), 30, "test");
    CHECK(g[0] != -7.0f);
    CHECK(loss.get() > 0);
    // A host buffer reused before its upload ran: the device sees the overwritten data.
    Tensor t({4}, DType::f32, dev.allocator());
    float src[4] = {1, 2, 3, 4};
    dev.copy_h2d(dev.compute_stream(), t.raw(), src, sizeof(src));
    src[0] = 99;
    float back[4] = {};
    dev.copy_d2h(dev.compute_stream(), back, t.raw(), sizeof(back));
    exec_synchronize(dev, dev.compute_stream(), 30, "test");
    CHECK(back[0] == 99);
    // Losses are read from slots that later passes reuse; a stale read is refused.
    auto first = model.forward_backward(x, y, 2);
    for (std::size_t i = 0; i < DevModel::loss_slots; ++i) model.forward_backward(x, y, 2);
    CHECK_THROWS_AS(first.get(), InvalidArgument);
  }

  TEST_CASE("host access to device memory is refused, and a raw dereference faults") {
    EmulatedDevice dev;
    DevModel model({Linear(3, 2)}, dev);
    CHECK_THROWS_WITH_AS(model.parameters().as<float>("optimizer step"),
                         doctest::Contains("optimizer step"), InvalidArgument);
    CHECK_THROWS_AS(model.parameter_span(), InvalidArgument);
    CHECK_THROWS_AS(model.gradient_span(), InvalidArgument);
    CHECK_THROWS_AS(clip_grad_norm(model.gradients(), 1.0), InvalidArgument);
    // The same view on the host policy is readable.
    Sequential host{Linear(3, 2)};
    CHECK(host.parameters().as<float>("optimizer step").size() == 8);
    const volatile float* p = static_cast<const volatile float*>(model.parameters().data);
    std::fflush(nullptr);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      std::signal(SIGSEGV, SIG_DFL);  // the test framework's crash handler is not for the child
      const float v = p[0];           // must fault
      ::_exit(v == v ? 42 : 43);      // reached only if the host could read device memory
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    const bool read = WIFEXITED(status) && WEXITSTATUS(status) >= 42;
    CHECK_FALSE(read);
    // Plainly a SIGSEGV; under a sanitizer that keeps its own handler, its error exit.
    CHECK((WIFSIGNALED(status) ? WTERMSIG(status) == SIGSEGV : !read && WEXITSTATUS(status) != 0));
  }

  TEST_CASE("copies in the wrong direction and host pointers given to kernels are refused") {
    EmulatedDevice dev;
    auto s = dev.compute_stream();
    Tensor a({8}, DType::f32, dev.allocator()), b({8}, DType::f32, dev.allocator());
    std::vector<float> h(8, 1.0f), h2(8);
    CHECK_THROWS_WITH_AS(dev.copy_h2d(s, h.data(), a.raw(), 32),
                         doctest::Contains("wrong copy direction"), DeviceError);
    CHECK_THROWS_AS(dev.copy_h2d(s, a.raw(), b.raw(), 32), DeviceError);
    CHECK_THROWS_AS(dev.copy_d2h(s, a.raw(), b.raw(), 32), DeviceError);
    CHECK_THROWS_AS(dev.copy_d2h(s, h2.data(), h.data(), 32), DeviceError);
    CHECK_THROWS_AS(dev.copy_d2d(s, h2.data(), a.raw(), 32), DeviceError);
    CHECK_THROWS_WITH_AS(dev.fill(s, h.data(), h.size(), 0.0f), doctest::Contains("host memory"),
                         DeviceError);
    CHECK_THROWS_AS(
        dev.bias_add(s, static_cast<float*>(a.raw()), h.data(), std::int64_t{2}, std::int64_t{4}),
        DeviceError);
    // The correct directions work and round-trip.
    dev.copy_h2d(s, a.raw(), h.data(), 32);
    dev.copy_d2d(s, b.raw(), a.raw(), 32);
    dev.copy_d2h(s, h2.data(), b.raw(), 32);
    exec_synchronize(dev, s, 30, "test");
    CHECK(h2 == h);
    // A device view handed to the host policy's kernels is refused too.
    CHECK_THROWS_AS(HostExec().reduce_into(HostStream{}, ReduceOp::sum, a.view(), b.view()),
                    InvalidArgument);
  }

  TEST_CASE("a failure on a stream is sticky and reported by the next wait") {
    EmulatedDevice dev;
    auto s = dev.compute_stream();
    Tensor a({8}, DType::f32, dev.allocator()), b({4}, DType::f32, dev.allocator());
    // Mismatched counts: the host kernel throws on the worker.
    dev.reduce_into(s, ReduceOp::sum, a.view(), b.view());
    CHECK_THROWS_WITH_AS(exec_synchronize(dev, s, 30, "test"), doctest::Contains("reduce_into"),
                         DeviceError);
    CHECK_THROWS_AS(dev.copy_h2d(s, a.raw(), std::vector<float>(8).data(), 32), DeviceError);
  }
}

namespace {
struct NotAPolicy {
  using stream_type = int;
  using event_type = int;
  static constexpr Space space = Space::host;
};
}  // namespace

TEST_CASE("the policy trait accepts HostExec and the emulated device, and names what is missing") {
  static_assert(is_exec_policy_v<HostExec>);
  static_assert(is_exec_policy_v<EmulatedDevice>);
  static_assert(!is_exec_policy_v<NotAPolicy>);
  static_assert(!is_exec_policy_v<int>);
  static_assert(detail::exec_probe::exec_has_types<NotAPolicy>::value);
  static_assert(!detail::exec_probe::exec_has_allocators<NotAPolicy>::value);
  // A host policy refuses device memory at construction, naming the space.
  struct DeviceLike final : Allocator {
    void* allocate(std::size_t, std::size_t) override { return nullptr; }
    void deallocate(void*, std::size_t) noexcept override {}
    Space space() const noexcept override { return Space::hip; }
  } dev;
  CHECK_THROWS_WITH_AS(HostExec{dev}, doctest::Contains("hip"), InvalidArgument);
}

}  // namespace dtrain_test_exec_emulated_test
