// Optimizers: SGD against hand-computed steps, AdamW against its published update equations,
// schedules, global-norm clipping, exact checkpoint round trips, and a state sharded over parts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/memory_state.hpp"

#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_optim_test {

using namespace dtrain;

namespace {
template <class T>
BufferView view(std::vector<T>& v) {
  return BufferView(span<T>(v));
}

using MemoryVisitor = dtrain::test::MemoryState;
}  // namespace

TEST_CASE("SGD: plain, weight decay, momentum and Nesterov by hand") {
  std::vector<double> p = {1.0, -2.0}, g = {0.5, 0.25};
  Sgd plain(view(p), view(g), 0.1);
  plain.step();
  CHECK(p[0] == doctest::Approx(0.95));
  CHECK(p[1] == doctest::Approx(-2.025));

  // Weight decay 0.1: d = g + 0.1 p = (0.6, 0.05).
  p = {1.0, -2.0};
  Sgd wd(view(p), view(g), 0.1, SgdOptions{0.0, 0.0, 0.1, false});
  wd.step();
  CHECK(p[0] == doctest::Approx(0.94));
  CHECK(p[1] == doctest::Approx(-2.005));

  // Momentum 0.9, grads 0.5 then 1.0: buf1 = 0.5, p1 = 1 - 0.05 = 0.95;
  // buf2 = 0.45 + 1.0 = 1.45, p2 = 0.95 - 0.145 = 0.805.
  std::vector<double> q = {1.0}, h = {0.5};
  Sgd mom(view(q), view(h), 0.1, SgdOptions{0.9, 0.0, 0.0, false});
  mom.step();
  CHECK(q[0] == doctest::Approx(0.95));
  h[0] = 1.0;
  mom.step();
  CHECK(q[0] == doctest::Approx(0.805));
  CHECK(mom.step_count() == 2);

  // Nesterov: step 1 uses g + 0.9 buf1 = 0.5 + 0.45 = 0.95 -> p = 0.905;
  // step 2: buf2 = 1.45, update 1.0 + 0.9 * 1.45 = 2.305 -> p = 0.905 - 0.2305 = 0.6745.
  q = {1.0};
  h = {0.5};
  Sgd nes(view(q), view(h), 0.1, SgdOptions{0.9, 0.0, 0.0, true});
  nes.step();
  CHECK(q[0] == doctest::Approx(0.905));
  h[0] = 1.0;
  nes.step();
  CHECK(q[0] == doctest::Approx(0.6745));

  // Dampening 0.5: buf2 = 0.9 * 0.5 + 0.5 * 1.0 = 0.95.
  q = {1.0};
  h = {0.5};
  Sgd damp(view(q), view(h), 0.1, SgdOptions{0.9, 0.5, 0.0, false});
  damp.step();
  h[0] = 1.0;
  damp.step();
  CHECK(q[0] == doctest::Approx(0.95 - 0.095));

  CHECK_THROWS_AS(Sgd(view(q), view(h), 0.1, SgdOptions{0.0, 0.0, 0.0, true}), InvalidArgument);
}

TEST_CASE("AdamW follows the published update equations") {
  // Independent transcription of Loshchilov & Hutter, Algorithm 2 (with eta = 1, the schedule
  // multiplier folded into lr): theta <- theta - lr*(mhat / (sqrt(vhat) + eps) + lambda*theta),
  // where the decay term uses the pre-update theta.
  const double lr = 0.01, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
  const std::size_t n = 9;
  RngStream rng(5, 0);
  std::vector<double> p(n), ref_p(n), m(n, 0.0), v(n, 0.0), g(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = ref_p[i] = rng.normal();
  AdamW opt(view(p), view(g), lr, AdamWOptions{b1, b2, eps, wd});
  for (int t = 1; t <= 6; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = rng.normal();
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double vhat = v[i] / (1 - std::pow(b2, t));
      ref_p[i] = ref_p[i] - lr * (mhat / (std::sqrt(vhat) + eps) + wd * ref_p[i]);
    }
    opt.step();
    for (std::size_t i = 0; i < n; ++i) CHECK(p[i] == doctest::Approx(ref_p[i]).epsilon(1e-12));
  }
  auto em = opt.exp_avg().as<double>();
  for (std::size_t i = 0; i < n; ++i) CHECK(em[i] == doctest::Approx(m[i]).epsilon(1e-12));

  // First step without decay: the bias-corrected update is lr * g / (|g| + eps) ~ lr * sign(g).
  std::vector<float> pf = {0.0f, 0.0f}, gf = {3.0f, -1e-3f};
  AdamW first(view(pf), view(gf), 0.1, AdamWOptions{0.9, 0.999, 1e-8, 0.0});
  first.step();
  CHECK(pf[0] == doctest::Approx(-0.1).epsilon(1e-6));
  CHECK(pf[1] == doctest::Approx(0.1).epsilon(1e-4));
}

TEST_CASE("schedules: constant, step decay, warm-up then cosine") {
  const Schedule c = 0.5;
  CHECK(c.lr(0) == 0.5);
  CHECK(c.lr(100000) == 0.5);
  const auto s = Schedule::step_decay(1.0, 10, 0.5);
  CHECK(s.lr(0) == 1.0);
  CHECK(s.lr(9) == 1.0);
  CHECK(s.lr(10) == 0.5);
  CHECK(s.lr(25) == 0.25);
  const auto w = Schedule::warmup_cosine(1.0, 4, 14, 0.1);
  CHECK(w.lr(0) == doctest::Approx(0.25));
  CHECK(w.lr(3) == doctest::Approx(1.0));
  CHECK(w.lr(4) == doctest::Approx(1.0));
  CHECK(w.lr(9) == doctest::Approx(0.55));  // halfway: min + (peak - min) / 2
  CHECK(w.lr(14) == doctest::Approx(0.1));
  CHECK(w.lr(1000) == doctest::Approx(0.1));
  for (int t = 4; t < 14; ++t) CHECK(w.lr(t + 1) <= w.lr(t));
  CHECK_THROWS_AS(Schedule::warmup_cosine(1.0, 10, 10), InvalidArgument);
  CHECK_THROWS_AS(Schedule::step_decay(1.0, 0, 0.5), InvalidArgument);
  // The optimizer uses lr(step) for the step about to be taken.
  std::vector<double> p = {0.0}, g = {1.0};
  Sgd opt(view(p), view(g), Schedule::step_decay(1.0, 1, 0.5));
  opt.step();
  opt.step();
  opt.step();
  CHECK(p[0] == doctest::Approx(-1.75));
  CHECK(opt.current_lr() == doctest::Approx(0.125));
}

TEST_CASE("clip_grad_norm scales to the global norm") {
  std::vector<float> g = {3.0f, 4.0f};
  CHECK(clip_grad_norm(view(g), 1.0) == doctest::Approx(5.0));
  CHECK(g[0] == doctest::Approx(0.6).epsilon(1e-5));
  CHECK(g[1] == doctest::Approx(0.8).epsilon(1e-5));
  std::vector<double> small = {0.3, 0.4};
  CHECK(clip_grad_norm(view(small), 1.0) == doctest::Approx(0.5));
  CHECK(small[0] == 0.3);
  std::vector<double> bad = {NAN, 1.0};
  CHECK(std::isnan(clip_grad_norm(view(bad), 1.0)));
  CHECK(bad[1] == 1.0);
  std::vector<std::int32_t> ints = {1};
  CHECK_THROWS_AS(clip_grad_norm(view(ints), 1.0), InvalidArgument);
  CHECK_THROWS_AS(clip_grad_norm(view(g), 0.0), InvalidArgument);
}

TEST_CASE_TEMPLATE("optimizer state round-trips exactly", Opt, Sgd, AdamW) {
  BasicSequential<float> m{Linear(3, 4), Tanh(), Linear(4, 2)};
  m.init(8);
  auto make = [&]() {
    if constexpr (std::is_same_v<Opt, Sgd>)
      return Sgd(m, Schedule::warmup_cosine(0.1, 2, 20), SgdOptions{0.9, 0.0, 1e-3, true});
    else
      return AdamW(m, Schedule::warmup_cosine(0.01, 2, 20));
  };
  Opt a = make();
  const float x[] = {0.1f, 0.2f, -0.3f, 1.0f, 0.5f, -1.0f};
  const std::int32_t y[] = {0, 1};
  auto train = [&](Opt& o, int steps) {
    for (int i = 0; i < steps; ++i) {
      m.zero_grad();
      m.forward_backward(x, y, 2);
      o.step();
    }
  };
  train(a, 3);
  MemoryVisitor saved;
  saved.child("model", m);
  saved.child("optimizer", a);
  CHECK(saved.ints.at("optimizer/step") == 3);
  CHECK(saved.strings.at("optimizer/schedule").find("warmup_cosine") == 0);
  train(a, 4);
  std::vector<float> expect(m.parameter_span().begin(), m.parameter_span().end());

  m.init(12345);  // scramble, then restore model and a fresh optimizer
  Opt b = make();
  saved.load = true;
  saved.child("model", m);
  saved.child("optimizer", b);
  CHECK(b.step_count() == 3);
  train(b, 4);
  CHECK(std::memcmp(expect.data(), m.parameters().data, m.parameters().bytes()) == 0);
}

TEST_CASE("optimizers reject mismatched arenas") {
  std::vector<float> p(4), g(3);
  std::vector<double> gd(4);
  CHECK_THROWS_AS(Sgd(view(p), view(g), 0.1), InvalidArgument);
  CHECK_THROWS_AS(AdamW(view(p), view(gd), 0.1), InvalidArgument);
  CHECK_THROWS_AS(AdamW(view(p), view(p), 0.1, AdamWOptions{1.0, 0.999, 1e-8, 0.0}),
                  InvalidArgument);
}

TEST_CASE("an MLP trained with AdamW and clipping fits a 3-class problem") {
  // Three Gaussian blobs; the classes are separable, so training accuracy must reach 100%.
  const std::int64_t n = 60;
  RngStream rng(9, 1);
  std::vector<float> x(n * 2);
  std::vector<std::int32_t> y(n);
  const float cx[] = {-2, 2, 0}, cy[] = {0, 0, 3};
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(i % 3);
    x[2 * i] = cx[y[i]] + 0.4f * static_cast<float>(rng.normal());
    x[2 * i + 1] = cy[y[i]] + 0.4f * static_cast<float>(rng.normal());
  }
  Sequential m{Linear(2, 16), Gelu(), LayerNorm(16), Linear(16, 3)};
  m.init(4);
  AdamW opt(m, Schedule::warmup_cosine(0.05, 10, 200, 1e-3));
  double loss = 0;
  for (int step = 0; step < 200; ++step) {
    m.zero_grad();
    loss = m.forward_backward(x.data(), y.data(), n);
    clip_grad_norm(m.gradients(), 5.0);
    opt.step();
  }
  CHECK(loss < 0.05);
  CHECK(m.accuracy(x.data(), y.data(), n) == 1.0);
}

TEST_CASE_TEMPLATE("a sharded state keeps its parts only and updates them as the whole state does",
                   Opt, Sgd, AdamW) {
  const std::size_t n = 40;
  std::vector<float> pa(n), pb(n), g(n);
  for (std::size_t i = 0; i < n; ++i) pa[i] = pb[i] = 0.1f * static_cast<float>(i) - 1.5f;
  auto make = [&](std::vector<float>& p) {
    if constexpr (std::is_same_v<Opt, Sgd>)
      return Sgd(view(p), view(g), 0.1, SgdOptions{0.9, 0.0, 1e-3, true});
    else
      return AdamW(view(p), view(g), 0.01);
  };
  Opt whole = make(pa), sharded = make(pb);
  // Three parts, one empty (dropped), kept back to back: 4 + 15 elements.
  const std::vector<std::pair<std::size_t, std::size_t>> parts = {{3, 4}, {10, 0}, {20, 15}};
  sharded.shard_state(parts);
  CHECK(sharded.state_partial());
  CHECK(sharded.state_elements() == 19u);
  CHECK(whole.state_elements() == n);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < n; ++i)
      g[i] = std::sin(0.7f * static_cast<float>(i) + static_cast<float>(step));
    whole.step();
    sharded.update(3, 4);
    sharded.update(27, 8);  // a part given in two pieces, out of order
    sharded.update(20, 7);
    sharded.complete_step();
  }
  auto in_parts = [&](std::size_t i) { return (i >= 3 && i < 7) || (i >= 20 && i < 35); };
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    if (in_parts(i))
      CHECK(std::memcmp(&pa[i], &pb[i], sizeof(float)) == 0);
    else
      CHECK(pb[i] == 0.1f * static_cast<float>(i) - 1.5f);  // never touched
  }
  // The compact state holds the whole state's parts back to back.
  std::vector<std::vector<float>> ws, ss;
  auto keep = [](std::vector<std::vector<float>>& out) {
    return [&out](BufferView s) {
      const auto* f = static_cast<const float*>(s.data);
      out.emplace_back(f, f + s.count);
    };
  };
  whole.for_each_state_arena(keep(ws));
  sharded.for_each_state_arena(keep(ss));
  REQUIRE(ws.size() == ss.size());
  REQUIRE_FALSE(ws.empty());
  for (std::size_t a = 0; a < ws.size(); ++a) {
    REQUIRE(ss[a].size() == 19u);
    CHECK(std::memcmp(ss[a].data(), &ws[a][3], 4 * sizeof(float)) == 0);
    CHECK(std::memcmp(&ss[a][4], &ws[a][20], 15 * sizeof(float)) == 0);
  }
  // Misuse: outside the parts, across a part's end, the whole step, other parts, bad parts.
  CHECK_THROWS_AS(sharded.update(7, 1), InvalidArgument);
  CHECK_THROWS_AS(sharded.update(5, 4), InvalidArgument);
  CHECK_THROWS_AS(sharded.step(), InvalidArgument);
  CHECK_THROWS_AS(sharded.shard_state({{3, 4}, {20, 16}}), InvalidArgument);
  sharded.shard_state(parts);  // the same parts again: nothing changes
  CHECK(sharded.state_elements() == 19u);
  Opt other = make(pb);
  CHECK_THROWS_AS(other.shard_state({{20, 4}, {3, 4}}), InvalidArgument);  // descending
  CHECK_THROWS_AS(other.shard_state({{3, 4}, {5, 4}}), InvalidArgument);   // overlapping
  CHECK_THROWS_AS(other.shard_state({{38, 4}}), InvalidArgument);          // outside
  CHECK_FALSE(other.state_partial());
  CHECK(other.state_elements() == n);
  // A sharded state is not saved; unsharding places the parts, zeros elsewhere, still partial.
  MemoryVisitor save;
  CHECK_THROWS_AS(save.child("optimizer", sharded), InvalidArgument);
  sharded.unshard_state();
  CHECK(sharded.state_partial());
  CHECK(sharded.state_elements() == n);
  std::vector<std::vector<float>> us;
  sharded.for_each_state_arena(keep(us));
  REQUIRE(us.size() == ws.size());
  for (std::size_t a = 0; a < ws.size(); ++a)
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(us[a][i] == (in_parts(i) ? ws[a][i] : 0.0f));
    }
  sharded.set_state_partial(false);
  CHECK_FALSE(sharded.state_partial());
  // Loading a whole state into a sharded optimizer keeps its parts of it: still sharded.
  MemoryVisitor saved;
  saved.child("optimizer", whole);
  Opt loaded = make(pb);
  loaded.shard_state(parts);
  saved.load = true;
  saved.child("optimizer", loaded);
  CHECK(loaded.state_partial());
  CHECK(loaded.state_elements() == 19u);
  CHECK(loaded.step_count() == whole.step_count());
  std::vector<std::vector<float>> ls;
  loaded.for_each_state_arena(keep(ls));
  CHECK(ls == ss);
  // Into an optimizer that is not sharded: whole.
  Opt loaded_whole = make(pb);
  saved.child("optimizer", loaded_whole);
  CHECK_FALSE(loaded_whole.state_partial());
  CHECK(loaded_whole.state_elements() == n);
  std::vector<std::vector<float>> lw;
  loaded_whole.for_each_state_arena(keep(lw));
  CHECK(lw == ws);
}

namespace {
// Host memory that counts what is live and the most that was.
struct PeakAllocator final : Allocator {
  std::size_t live = 0, peak = 0;
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    live += bytes;
    peak = std::max(peak, live);
    return default_allocator().allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    live -= bytes;
    default_allocator().deallocate(p, bytes);
  }
  Space space() const noexcept override { return Space::host; }
};
}  // namespace

TEST_CASE_TEMPLATE("a state sharded before its first use is never whole-sized", Opt, Sgd, AdamW) {
  const std::size_t n = 4000;
  const int arenas = std::is_same_v<Opt, Sgd> ? 1 : 2;  // momentum; the two moments
  std::vector<float> pa(n), pb(n), g(n);
  for (std::size_t i = 0; i < n; ++i) pa[i] = pb[i] = 0.001f * static_cast<float>(i) - 1.0f;
  PeakAllocator counted;
  auto make = [&](std::vector<float>& p, Allocator& a) {
    if constexpr (std::is_same_v<Opt, Sgd>)
      return Sgd(view(p), view(g), 0.1, SgdOptions{0.9, 0.0, 1e-3, false}, a);
    else
      return AdamW(view(p), view(g), 0.01, AdamWOptions{}, a);
  };
  Opt whole = make(pa, default_allocator());
  Opt sharded = make(pb, counted);
  CHECK(counted.peak == 0u);  // nothing made before the first use
  const StateParts parts = {{100, 300}, {2000, 500}};
  sharded.shard_state(parts);
  auto step = [&](int k) {
    for (std::size_t i = 0; i < n; ++i)
      g[i] = std::cos(0.3f * static_cast<float>(i) + static_cast<float>(k));
    whole.step();
    sharded.update(2000, 500);
    sharded.update(100, 300);
    sharded.complete_step();
  };
  for (int k = 0; k < 3; ++k) step(k);
  // The state of the 800 elements held, in every arena, and never more.
  CHECK(counted.peak == static_cast<std::size_t>(arenas) * 800 * sizeof(float));
  CHECK(counted.live == counted.peak);
  for (std::size_t i : {std::size_t{100}, std::size_t{399}, std::size_t{2000}, std::size_t{2499}})
    CHECK(std::memcmp(&pa[i], &pb[i], sizeof(float)) == 0);
  CHECK(pb[99] == 0.001f * 99.0f - 1.0f);  // outside the parts: untouched

  // A restore into it holds one tensor whole at a time while it loads, and keeps the parts.
  MemoryVisitor saved;
  saved.child("optimizer", whole);
  for (int k = 3; k < 5; ++k) step(k);  // both move on; the restore takes them back
  std::vector<float> pw = pa;
  saved.load = true;
  counted.peak = counted.live;
  saved.child("optimizer", sharded);
  saved.child("optimizer", whole);
  // Beyond what it holds: the loading tensor whole, and its new compact arena beside the old.
  CHECK(counted.peak <= counted.live + (n + 800) * sizeof(float));
  CHECK(counted.live == static_cast<std::size_t>(arenas) * 800 * sizeof(float));
  CHECK(sharded.state_elements() == 800u);
  CHECK(sharded.step_count() == 3);
  pb = pa = pw;  // the same parameters on both, then the same steps from the restored state
  for (int k = 3; k < 5; ++k) step(k);
  for (std::size_t i : {std::size_t{100}, std::size_t{399}, std::size_t{2000}, std::size_t{2499}})
    CHECK(std::memcmp(&pa[i], &pb[i], sizeof(float)) == 0);
}

}  // namespace dtrain_test_optim_test
