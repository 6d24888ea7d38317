// Model: layer and loss gradients against float64 central finite differences, the arena layout,
// the grad-ready callback, deterministic init, dropout, accumulation, checkpoint state, learning.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/memory_state.hpp"

#include <dtrain/core/rng.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/model/model.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_model_test {

using namespace dtrain;

namespace {

std::vector<double> random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  RngStream rng(seed, 3);
  std::vector<double> v(n);
  for (auto& x : v) x = lo + (hi - lo) * rng.uniform_double();
  return v;
}

// Loss of a double model at its current parameters (training pass at a fixed dropout step).
double eval_loss(BasicSequential<double>& m, const std::vector<double>& x,
                 const std::vector<std::int32_t>& labels, const std::vector<double>& targets,
                 std::int64_t batch, Loss loss, bool regression) {
  PassOptions opt;
  opt.step = 3;
  const double* out = m.forward(x.data(), batch, opt);
  const std::int64_t n = batch * m.out_features();
  if (regression)
    return host::ref::mse(out, targets.data(), batch, m.out_features(),
                          static_cast<double*>(nullptr));
  if (loss == Loss::softmax_cross_entropy)
    return host::ref::softmax_cross_entropy(out, labels.data(), batch, m.out_features(),
                                            static_cast<double*>(nullptr));
  std::vector<double> onehot(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t r = 0; r < batch; ++r) onehot[r * m.out_features() + labels[r]] = 1;
  return host::ref::mse(out, onehot.data(), batch, m.out_features(), static_cast<double*>(nullptr));
}

// Compares the analytic gradient of every parameter with central differences; returns the
// norm-wise relative error ||g - fd|| / max(||g||, ||fd||).
double gradient_error(std::vector<LayerSpec> layers, std::int64_t batch, Loss loss, bool regression,
                      std::uint64_t seed) {
  BasicSequential<double> m(layers);
  m.init(seed);
  // Perturb LayerNorm's unit scale and zero shift so their gradients are generic.
  auto p = m.parameter_span();
  auto noise = random_vec(p.size(), seed + 1, -0.2, 0.2);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  const std::int64_t classes = m.out_features();
  auto x = random_vec(static_cast<std::size_t>(batch * m.in_features()), seed + 2, -2, 2);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::int64_t r = 0; r < batch; ++r)
    labels[r] = static_cast<std::int32_t>((r * 7 + 3) % classes);
  auto targets = random_vec(static_cast<std::size_t>(batch * classes), seed + 3);
  PassOptions opt;
  opt.step = 3;
  m.zero_grad();
  if (regression)
    m.forward_backward(x.data(), targets.data(), batch, Loss::mse, {}, opt);
  else
    m.forward_backward(x.data(), labels.data(), batch, loss, {}, opt);
  std::vector<double> g(m.gradient_span().begin(), m.gradient_span().end());
  double num = 0, den_a = 0, den_b = 0;
  const double h = 1e-5;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double lp = eval_loss(m, x, labels, targets, batch, loss, regression);
    p[i] = keep - h;
    const double lm = eval_loss(m, x, labels, targets, batch, loss, regression);
    p[i] = keep;
    const double fd = (lp - lm) / (2 * h);
    num += (g[i] - fd) * (g[i] - fd);
    den_a += g[i] * g[i];
    den_b += fd * fd;
  }
  // One class under softmax has a constant loss: both gradients must then be exactly zero.
  if (classes == 1 && loss == Loss::softmax_cross_entropy && !regression) return num + den_a;
  REQUIRE(den_a > 0);
  return std::sqrt(num) / std::max(std::sqrt(den_a), std::sqrt(den_b));
}

}  // namespace

TEST_CASE("every layer and loss: gradients match float64 finite differences") {
  struct Case {
    const char* name;
    std::vector<LayerSpec> layers;
  };
  // A Linear before the layer under test turns its input gradient into parameter gradients, so
  // each layer's backward (dx) is checked as well as its own parameters.
  for (std::int64_t batch : {1, 3, 8}) {
    for (std::int64_t w : {1, 5}) {
      const std::vector<Case> cases = {
          {"linear", {Linear(3, w)}},
          {"linear-linear", {Linear(4, w), Linear(w, 3)}},
          {"relu", {Linear(3, 6), Relu(), Linear(6, w)}},
          {"gelu", {Linear(3, 6), Gelu(), Linear(6, w)}},
          {"tanh", {Linear(2, 7), Tanh(), Linear(7, w)}},
          {"layernorm", {Linear(3, 5), LayerNorm(5), Linear(5, w)}},
          {"layernorm-1", {Linear(3, 1), LayerNorm(1), Linear(1, w)}},
          {"dropout", {Linear(3, 9), Dropout(0.4f), Linear(9, w)}},
          {"mlp",
           {Linear(5, 7), LayerNorm(7), Gelu(), Dropout(0.2f), Linear(7, 4), Tanh(), Linear(4, w)}},
      };
      for (const auto& c : cases) {
        for (int loss_kind = 0; loss_kind < 3; ++loss_kind) {
          const Loss loss = loss_kind == 0 ? Loss::softmax_cross_entropy : Loss::mse;
          const bool regression = loss_kind == 2;
          INFO(std::string(c.name)
               << " batch=" << batch << " width=" << w << " loss=" << loss_kind);
          const double err = gradient_error(c.layers, batch, loss, regression,
                                            static_cast<std::uint64_t>(batch * 100 + w));
          CHECK(err < 1e-6);
        }
      }
    }
  }
}

TEST_CASE("parameters and gradients live in one arena each, in layer order") {
  Sequential m{Linear(4, 3), Relu(), LayerNorm(3), Linear(3, 2)};
  const auto& info = m.parameter_info();
  REQUIRE(info.size() == 6);
  CHECK(info[0].name == "layers/0_linear/weight");
  CHECK(info[0].shape == Shape{3, 4});
  CHECK(info[1].name == "layers/0_linear/bias");
  CHECK(info[1].shape == Shape{3});
  CHECK(info[2].name == "layers/2_layernorm/weight");
  CHECK(info[3].name == "layers/2_layernorm/bias");
  CHECK(info[4].name == "layers/3_linear/weight");
  CHECK(info[4].shape == Shape{2, 3});
  std::size_t expect = 0;
  for (const auto& p : info) {
    CHECK(p.offset == expect);
    expect += p.count;
  }
  CHECK(expect == m.parameter_count());
  CHECK(m.parameters().count == expect);
  CHECK(m.gradients().count == expect);
  CHECK(m.parameters().dtype == DType::f32);
  CHECK(m.in_features() == 4);
  CHECK(m.out_features() == 2);
}

TEST_CASE("grad-ready callback: last layer first, each range final when reported") {
  Sequential m{Linear(6, 8), Tanh(), Linear(8, 8), Relu(), Linear(8, 3)};
  m.init(5);
  auto x = random_vec(4 * 6, 9);
  std::vector<float> xf(x.begin(), x.end());
  const std::int32_t labels[] = {0, 1, 2, 1};
  struct Seen {
    std::size_t offset, count;
    std::vector<float> values;
    bool earlier_untouched;
  };
  std::vector<Seen> seen;
  auto g = m.gradient_span();
  m.forward_backward(
      xf.data(), labels, 4, Loss::softmax_cross_entropy, [&](std::size_t off, std::size_t cnt) {
        bool untouched = true;
        for (std::size_t i = 0; i < off; ++i) untouched &= g[i] == 0.0f;
        seen.push_back(
            {off, cnt, std::vector<float>(g.begin() + off, g.begin() + off + cnt), untouched});
      });
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].offset + seen[0].count == m.parameter_count());
  CHECK(seen[1].offset + seen[1].count == seen[0].offset);
  CHECK(seen[2].offset + seen[2].count == seen[1].offset);
  CHECK(seen[2].offset == 0);
  for (const auto& s : seen) {
    // Early: the layers below have not started their backward yet.
    CHECK(s.earlier_untouched);
    // Final: nothing changes the range after it was reported.
    CHECK(std::memcmp(s.values.data(), g.data() + s.offset, s.count * sizeof(float)) == 0);
  }
}

TEST_CASE("init is deterministic per seed and follows Kaiming and Xavier scales") {
  Sequential a{Linear(400, 300), Relu(), Linear(300, 10, Init::xavier_normal)};
  Sequential b{Linear(400, 300), Relu(), Linear(300, 10, Init::xavier_normal)};
  a.init(42);
  b.init(42);
  CHECK(std::memcmp(a.parameters().data, b.parameters().data, a.parameters().bytes()) == 0);
  b.init(43);
  CHECK(std::memcmp(a.parameters().data, b.parameters().data, a.parameters().bytes()) != 0);
  // A fresh model is already initialised, as with seed 0.
  Sequential fresh{Linear(400, 300), Relu(), Linear(300, 10, Init::xavier_normal)};
  b.init(0);
  CHECK(std::memcmp(fresh.parameters().data, b.parameters().data, b.parameters().bytes()) == 0);
  auto p = a.parameter_span();
  const auto& info = a.parameter_info();
  // Kaiming uniform: U(-sqrt(6/fan_in), sqrt(6/fan_in)), variance 2/fan_in.
  const double bound = std::sqrt(6.0 / 400);
  double sum = 0, sq = 0, mx = 0;
  for (std::size_t i = 0; i < info[0].count; ++i) {
    sum += p[i];
    sq += double(p[i]) * p[i];
    mx = std::max(mx, std::abs(double(p[i])));
  }
  const double n = static_cast<double>(info[0].count);
  CHECK(mx <= bound);
  CHECK(mx > 0.99 * bound);
  CHECK(std::abs(sum / n) < 0.005);
  CHECK(sq / n == doctest::Approx(2.0 / 400).epsilon(0.02));
  for (std::size_t i = info[1].offset; i < info[1].offset + info[1].count; ++i) CHECK(p[i] == 0.0f);
  // Xavier normal: variance 2 / (fan_in + fan_out).
  sq = 0;
  for (std::size_t i = info[2].offset; i < info[2].offset + info[2].count; ++i)
    sq += double(p[i]) * p[i];
  CHECK(sq / info[2].count == doctest::Approx(2.0 / 310).epsilon(0.1));
}

TEST_CASE("dropout: same mask for the same sample whatever the batch split") {
  // The blocked GEMM gives each row the same bits whatever the batch (a BLAS need not), so the
  // outputs of the two splits compare exactly.
  HostExec blocked(default_allocator(), host::GemmPath::blocked);
  BasicSequential<float> m({Linear(5, 16), Dropout(0.5f), Linear(16, 3)}, blocked);
  m.init(7);
  auto x = random_vec(6 * 5, 13);
  std::vector<float> xf(x.begin(), x.end());
  PassOptions opt;
  opt.step = 11;
  opt.sample_offset = 40;
  std::vector<float> whole(m.forward(xf.data(), 6, opt), m.forward(xf.data(), 6, opt) + 18);
  // Rank 0 of two holds samples 40..42, rank 1 holds 43..45.
  PassOptions r0 = opt, r1 = opt;
  r1.sample_offset = 43;
  std::vector<float> split(18);
  const float* o0 = m.forward(xf.data(), 3, r0);
  std::copy(o0, o0 + 9, split.begin());
  const float* o1 = m.forward(xf.data() + 15, 3, r1);
  std::copy(o1, o1 + 9, split.begin() + 9);
  CHECK(whole == split);
  // Evaluation is deterministic and mask-free: equals the undropped network.
  PassOptions eval;
  eval.training = false;
  std::vector<float> e1(m.forward(xf.data(), 6, eval), m.forward(xf.data(), 6, eval) + 18);
  CHECK(e1 != whole);
  Sequential plain{Linear(5, 16), Linear(16, 3)};
  std::memcpy(plain.parameters().data, m.parameters().data, m.parameters().bytes());
  const float* pe = plain.forward(xf.data(), 6, eval);
  for (int i = 0; i < 18; ++i) CHECK(pe[i] == doctest::Approx(e1[i]).epsilon(1e-6));
  // Default steps come from the model's counter and advance only in training.
  const auto before = m.step_count();
  m.forward(xf.data(), 6);
  m.forward(xf.data(), 6, eval);
  CHECK(m.step_count() == before + 1);
}

TEST_CASE("gradient accumulation over micro-batches equals the full batch") {
  BasicSequential<double> m{Linear(4, 6), Gelu(), LayerNorm(6), Linear(6, 3)};
  m.init(3);
  const std::int64_t batch = 8;
  auto x = random_vec(batch * 4, 17);
  std::vector<std::int32_t> labels = {0, 1, 2, 0, 1, 2, 2, 1};
  m.forward_backward(x.data(), labels.data(), batch);
  std::vector<double> full(m.gradient_span().begin(), m.gradient_span().end());
  m.zero_grad();
  PassOptions half;
  half.loss_scale = 0.5;
  m.forward_backward(x.data(), labels.data(), 4, Loss::softmax_cross_entropy, {}, half);
  half.sample_offset = 4;
  m.forward_backward(x.data() + 16, labels.data() + 4, 4, Loss::softmax_cross_entropy, {}, half);
  auto acc = m.gradient_span();
  for (std::size_t i = 0; i < full.size(); ++i)
    CHECK(acc[i] == doctest::Approx(full[i]).epsilon(1e-12));
  m.zero_grad();
  for (double v : m.gradient_span()) CHECK(v == 0.0);
}

namespace {
using MemoryVisitor = dtrain::test::MemoryState;
}  // namespace

TEST_CASE("Sequential state round-trips exactly through the state protocol") {
  static_assert(has_visit_state_v<Sequential>, "Sequential implements the state protocol");
  Sequential a{Linear(3, 5), LayerNorm(5), Dropout(0.3f), Linear(5, 2)};
  a.init(21);
  auto x = random_vec(4 * 3, 5);
  std::vector<float> xf(x.begin(), x.end());
  const std::int32_t labels[] = {0, 1, 1, 0};
  a.forward_backward(xf.data(), labels, 4);
  a.forward_backward(xf.data(), labels, 4);
  MemoryVisitor saver;
  saver.child("model", a);
  CHECK(saver.shapes.at("model/layers/0_linear/weight") == Shape{5, 3});
  CHECK(saver.shapes.at("model/layers/1_layernorm/bias") == Shape{5});
  CHECK(saver.shapes.at("model/layers/3_linear/weight") == Shape{2, 5});
  CHECK(saver.ints.at("model/step_count") == 2);
  Sequential b{Linear(3, 5), LayerNorm(5), Dropout(0.3f), Linear(5, 2)};
  b.init(999);
  saver.load = true;
  saver.child("model", b);
  CHECK(std::memcmp(a.parameters().data, b.parameters().data, a.parameters().bytes()) == 0);
  CHECK(b.step_count() == 2);
  // Same next training step (same dropout mask) on both.
  a.zero_grad();
  b.zero_grad();
  CHECK(a.forward_backward(xf.data(), labels, 4) == b.forward_backward(xf.data(), labels, 4));
  CHECK(std::memcmp(a.gradients().data, b.gradients().data, a.gradients().bytes()) == 0);
}

namespace {
struct CountingAllocator final : Allocator {
  std::size_t live = 0, calls = 0;
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    ++calls;
    live += bytes;
    return default_allocator().allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    live -= bytes;
    default_allocator().deallocate(p, bytes);
  }
  Space space() const noexcept override { return Space::host; }
};
// Hands out memory full of NaN bit patterns: the model must not depend on zeroed memory.
struct DirtyAllocator final : Allocator {
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = default_allocator().allocate(bytes, alignment);
    std::memset(p, 0xff, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    default_allocator().deallocate(p, bytes);
  }
  Space space() const noexcept override { return Space::host; }
};
struct DeviceLikeAllocator final : Allocator {
  void* allocate(std::size_t, std::size_t) override { return nullptr; }
  void deallocate(void*, std::size_t) noexcept override {}
  Space space() const noexcept override { return Space::cuda; }
};
}  // namespace

TEST_CASE("arenas come from the allocator given; bad models are rejected with a message") {
  CountingAllocator alloc;
  {
    Sequential m({Linear(10, 4), Relu(), Linear(4, 2)}, alloc);
    // Both arenas, the loss slots and (from the first pass) activations and staging buffers.
    CHECK(alloc.live >= 2 * m.parameter_count() * sizeof(float));
    const std::size_t before = alloc.live;
    const float xs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const std::int32_t ys[] = {1};
    m.forward_backward(xs, ys, 1);
    CHECK(alloc.live > before);
    // Steady state: once both input stages have been used, passes allocate nothing.
    m.forward_backward(xs, ys, 1);
    const std::size_t calls = alloc.calls;
    for (int i = 0; i < 3; ++i) m.forward_backward(xs, ys, 1);
    CHECK(alloc.calls == calls);
  }
  CHECK(alloc.live == 0);
  DirtyAllocator dirty;
  Sequential d({Linear(3, 4), LayerNorm(4), Linear(4, 2)}, dirty);
  for (float v : d.gradient_span()) CHECK(v == 0.0f);
  const float x3[] = {1, 2, 3};
  const std::int32_t y1[] = {1};
  CHECK(std::isfinite(d.forward_backward(x3, y1, 1)));
  try {
    Sequential bad{Linear(4, 3), Linear(4, 2)};
    FAIL("width mismatch accepted");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    CHECK(what.find("dtrain: rank") == 0);
    CHECK(what.find("Sequential") != std::string::npos);
    CHECK(what.find("layer 1 (linear)") != std::string::npos);
    CHECK(what.find("expects 4 features but receives samples of shape [3]") != std::string::npos);
    CHECK(what.find("dtrain: rank", 1) == std::string::npos);  // one prefix, not two
  }
  CHECK_THROWS_AS(Sequential({Relu(), Linear(3, 2)}), InvalidArgument);
  DeviceLikeAllocator dev;
  CHECK_THROWS_AS(Sequential({Linear(3, 2)}, dev), InvalidArgument);
  Sequential m{Linear(3, 2)};
  const std::int32_t bad_label[] = {5};
  const float x[] = {1, 2, 3};
  CHECK_THROWS_AS(m.forward_backward(x, bad_label, 1), InvalidArgument);
  // Real-valued targets only make sense for a regression loss.
  const float target[] = {0.5f, 0.5f};
  CHECK_THROWS_AS(m.forward_backward(x, target, 1, Loss::softmax_cross_entropy), InvalidArgument);
}

TEST_CASE("a small MLP learns XOR to a loss below 0.02") {
  Sequential m{Linear(2, 16), Tanh(), Linear(16, 2)};
  m.init(1);
  const float x[] = {0, 0, 0, 1, 1, 0, 1, 1};
  const std::int32_t y[] = {0, 1, 1, 0};
  double loss = 0;
  auto p = m.parameter_span();
  auto g = m.gradient_span();
  for (int step = 0; step < 2000; ++step) {
    m.zero_grad();
    loss = m.forward_backward(x, y, 4);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.5f * g[i];
  }
  CHECK(loss < 0.02);
  CHECK(m.accuracy(x, y, 4) == 1.0);
  std::int32_t pred[4];
  m.predict(x, 4, pred);
  for (int i = 0; i < 4; ++i) CHECK(pred[i] == y[i]);
}

TEST_CASE("regression onto a linear teacher reaches the teacher (mse below 1e-6)") {
  // y = A x + b with A, b known; a single Linear layer must recover them.
  const std::int64_t in = 3, out = 2, batch = 32;
  const double A[] = {0.5, -1.0, 2.0, 1.5, 0.25, -0.75}, bias[] = {0.1, -0.3};
  auto xs = random_vec(batch * in, 77);
  std::vector<float> x(xs.begin(), xs.end()), t(batch * out);
  for (std::int64_t r = 0; r < batch; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = bias[o];
      for (std::int64_t i = 0; i < in; ++i) s += A[o * in + i] * x[r * in + i];
      t[r * out + o] = static_cast<float>(s);
    }
  Sequential m{Linear(in, out)};
  m.init(2);
  auto p = m.parameter_span();
  auto g = m.gradient_span();
  double loss = 1;
  for (int step = 0; step < 3000 && loss > 1e-7; ++step) {
    m.zero_grad();
    loss = m.forward_backward(x.data(), t.data(), batch, Loss::mse);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.3f * g[i];
  }
  CHECK(loss < 1e-6);
  for (int i = 0; i < 6; ++i) CHECK(p[i] == doctest::Approx(A[i]).epsilon(1e-3));
  CHECK(p[6] == doctest::Approx(bias[0]).epsilon(1e-3));
}

namespace {
struct FakeBatch {  // the members a loader batch provides
  Tensor features, labels;
  std::vector<std::int64_t> indices;
  std::size_t size = 0;
};
struct FakeSync {
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  void ready(std::size_t offset, std::size_t count) { seen.emplace_back(offset, count); }
};
}  // namespace

TEST_CASE("loader batches and gradient syncs plug in directly") {
  Sequential m{Linear(3, 6), Dropout(0.5f), Linear(6, 2)};
  m.init(4);
  FakeBatch b;
  b.size = 4;
  b.features = Tensor({4, 3}, DType::f32);
  b.labels = Tensor({4}, DType::i32);
  b.indices = {17, 3, 99, 42};
  auto xs = random_vec(12, 21);
  for (int i = 0; i < 12; ++i) b.features.as<float>()[i] = static_cast<float>(xs[i]);
  for (int i = 0; i < 4; ++i) b.labels.as<std::int32_t>()[i] = i % 2;
  FakeSync sync;
  PassOptions opt;
  opt.step = 2;
  const double loss = m.forward_backward(b, sync, Loss::softmax_cross_entropy, opt);
  REQUIRE(sync.seen.size() == 2);
  CHECK(sync.seen[0].first + sync.seen[0].second == m.parameter_count());
  CHECK(sync.seen[1].first == 0);
  std::vector<float> g1(m.gradient_span().begin(), m.gradient_span().end());
  // Same rows with explicit sample ids (the dataset indices) give the same loss and gradients.
  m.zero_grad();
  opt.sample_ids = b.indices.data();
  FakeSync sync2;
  CHECK(m.forward_backward(b.features.as<float>().data(), b.labels.as<std::int32_t>().data(), 4,
                           Loss::softmax_cross_entropy, sync2, opt) == loss);
  CHECK(std::memcmp(g1.data(), m.gradients().data, m.gradients().bytes()) == 0);
  // A batch whose rows do not match the model is rejected.
  b.features = Tensor({4, 2}, DType::f32);
  CHECK_THROWS_AS(m.forward_backward(b, sync), InvalidArgument);
  b.features = Tensor({4, 3}, DType::f64);
  CHECK_THROWS_AS(m.forward_backward(b, sync), InvalidArgument);
}

TEST_CASE("models on concurrent threads (loopback ranks) compute what they compute alone") {
  auto run = [](int rank, std::vector<float>& grads, double& loss) {
    Sequential m{Linear(20, 64), Gelu(), LayerNorm(64), Dropout(0.25f), Linear(64, 5)};
    m.init(77);
    auto xs = random_vec(16 * 20, 100 + rank);
    std::vector<float> x(xs.begin(), xs.end());
    std::vector<std::int32_t> y(16);
    for (int i = 0; i < 16; ++i) y[i] = (i + rank) % 5;
    PassOptions opt;
    opt.sample_offset = 16 * rank;
    for (int step = 0; step < 3; ++step)
      loss = m.forward_backward(x.data(), y.data(), 16, Loss::softmax_cross_entropy, {}, opt);
    grads.assign(m.gradient_span().begin(), m.gradient_span().end());
  };
  const int ranks = 3;
  std::vector<std::vector<float>> alone(ranks), together(ranks);
  std::vector<double> l_alone(ranks), l_together(ranks);
  for (int r = 0; r < ranks; ++r) run(r, alone[r], l_alone[r]);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] { run(r, together[r], l_together[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    CHECK(l_alone[r] == l_together[r]);
    CHECK(alone[r] == together[r]);
  }
}

TEST_CASE("an empty batch is a no-op with zero loss") {
  Sequential m{Linear(3, 4), LayerNorm(4), Dropout(0.5f), Linear(4, 2)};
  m.init(1);
  CHECK(m.forward_backward(static_cast<const float*>(nullptr),
                           static_cast<const std::int32_t*>(nullptr), 0) == 0.0);
  for (float v : m.gradient_span()) CHECK(v == 0.0f);
  const float x[] = {1, 2, 3};
  const std::int32_t y[] = {1};
  CHECK(m.forward_backward(x, y, 1) > 0.0);
}

TEST_CASE("metrics") {
  const float logits[] = {0.1f, 0.9f, 0.0f, 2.0f, 1.0f, 1.0f, 0.5f, 0.5f, 0.5f};
  const std::int32_t labels[] = {1, 0, 2};
  CHECK(argmax(logits, 3) == 1);
  CHECK(argmax(logits + 6, 3) == 0);  // first on ties
  CHECK(count_correct(logits, labels, 3, 3) == 2);
  CHECK(accuracy(logits, labels, 3, 3) == doctest::Approx(2.0 / 3.0));
  CHECK(accuracy(logits, labels, 0, 3) == 0.0);
}

}  // namespace dtrain_test_model_test
