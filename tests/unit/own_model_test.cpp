// ParameterSet, the arenas of a model that computes its own gradients: layout, names and
// checks; init; adopted buffers; no host copy kept after init (an allocator's live bytes);
// grad-ready reports; the optimizers and clipping on a set give
// the bits they give on a Sequential holding the same values; and the state protocol writes a
// Sequential's layout, so either restores the other's state.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "support/memory_state.hpp"
#include "support/messages.hpp"

#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_own_model_test {

using namespace dtrain;

namespace {
std::vector<ParameterSpec> mlp_specs() {
  return {{"encoder/weight", {8, 5}, ParameterInit::kaiming_uniform},
          {"encoder/bias", {8}, ParameterInit::zeros},
          {"head/weight", {3, 8}, ParameterInit::xavier_normal},
          {"head/bias", {3}},
          {"scale", {}, ParameterInit::ones}};
}

// Hand-written forward and backward of y = x W^T + b under the mean squared error, gradients
// written (not accumulated) into gw [out, in] and gb [out]; returns the loss.
double linear_mse_by_hand(const float* w, const float* b, const float* x, const float* t,
                          std::int64_t rows, std::int64_t in, std::int64_t out, float* gw,
                          float* gb) {
  const double n = static_cast<double>(rows * out);
  std::vector<double> dw(static_cast<std::size_t>(out * in), 0.0), db(out, 0.0);
  double loss = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double y = b[o];
      for (std::int64_t i = 0; i < in; ++i) y += double(w[o * in + i]) * x[r * in + i];
      const double d = y - t[r * out + o];
      loss += d * d / n;
      db[o] += 2 * d / n;
      for (std::int64_t i = 0; i < in; ++i) dw[o * in + i] += 2 * d / n * x[r * in + i];
    }
  for (std::size_t k = 0; k < dw.size(); ++k) gw[k] = static_cast<float>(dw[k]);
  for (std::int64_t o = 0; o < out; ++o) gb[o] = static_cast<float>(db[o]);
  return loss;
}
}  // namespace

TEST_CASE("own_model: tensors lie back to back in the order given, with their names and shapes") {
  ParameterSet set(mlp_specs());
  CHECK(set.size() == 5);
  CHECK(set.parameter_count() == 40 + 8 + 24 + 3 + 1);
  CHECK(set.owns_memory());
  const auto& info = set.parameter_info();
  const std::size_t offsets[] = {0, 40, 48, 72, 75};
  const std::size_t counts[] = {40, 8, 24, 3, 1};
  for (std::size_t i = 0; i < info.size(); ++i) {
    CAPTURE(i);
    CHECK(info[i].offset == offsets[i]);
    CHECK(info[i].count == counts[i]);
    CHECK(info[i].layer == i);
    const auto r = set.tensor(i);
    CHECK(*r.name == info[i].name);
    CHECK(*r.shape == info[i].shape);
    CHECK(r.index == i);
    CHECK(r.param == set.parameter_span().data() + offsets[i]);
    CHECK(r.grad == set.gradient_span().data() + offsets[i]);
  }
  CHECK(info[2].name == "head/weight");
  CHECK(info[2].shape == Shape{3, 8});
  CHECK(info[4].shape.empty());  // a 0-d tensor holds one element
  CHECK(set.index_of("head/bias") == 3);
  CHECK(set.tensor("encoder/bias").offset == 40);
  CHECK(set.parameters().count == set.parameter_count());
  CHECK(set.gradients().dtype == DType::f32);
  CHECK(set.parameters().space == Space::host);
  BasicParameterSet<double> d(mlp_specs());
  CHECK(d.parameters().dtype == DType::f64);
  ParameterSet empty({});
  CHECK(empty.parameter_count() == 0);
  CHECK(empty.parameters().count == 0);
}

TEST_CASE("own_model: malformed specs and unknown names are rejected with the reason") {
  using test::contains;
  using test::invalid_argument_text;
  auto make = [](std::vector<ParameterSpec> s) { return [s] { ParameterSet set(s); }; };
  CHECK(contains(invalid_argument_text(make({{"w", {2}}, {"w", {3}}})), "given twice"));
  CHECK(contains(invalid_argument_text(make({{"enc", {2}}, {"enc/w", {3}}})), "clash"));
  CHECK(contains(invalid_argument_text(make({{"enc/w", {2}}, {"enc", {3}}})), "clash"));
  CHECK(contains(invalid_argument_text(make({{"", {2}}})), "empty tensor name"));
  CHECK(contains(invalid_argument_text(make({{"a//b", {2}}})), "empty path component"));
  CHECK(contains(invalid_argument_text(make({{"/a", {2}}})), "empty path component"));
  CHECK(contains(invalid_argument_text(make({{"a/", {2}}})), "empty path component"));
  CHECK(contains(invalid_argument_text(make({{"seed", {2}}})), "taken"));
  CHECK(contains(invalid_argument_text(make({{"step_count", {2}}})), "taken"));
  CHECK(contains(invalid_argument_text(make({{"w", {2, -1}}})), "negative extent"));
  CHECK(
      contains(invalid_argument_text(make({{"b", {4}, ParameterInit::kaiming_normal}})), "fan_in"));
  // Names that share a prefix without one being a group of the other are fine.
  ParameterSet ok({{"enc", {1}}, {"encoder/w", {2}}, {"enc_b", {1}}});
  CHECK(ok.size() == 3);
  CHECK(contains(invalid_argument_text([&] { ok.tensor("nope"); }), "no tensor named 'nope'"));
  CHECK(contains(invalid_argument_text([&] { ok.tensor(3); }), "tensor 3 of a set of 3"));
  CHECK(contains(invalid_argument_text([&] { ok.grad_ready(7, {}); }), "tensor 7"));
}

TEST_CASE("own_model: init follows each tensor's rule, the same for the same seed") {
  ParameterSet a(mlp_specs()), b(mlp_specs());
  // Construction zeroes the arenas and applies init(0).
  for (float v : a.gradient_span()) CHECK(v == 0.0f);
  CHECK(a.tensor("scale").param[0] == 1.0f);
  a.tensor("head/bias").param[1] = 7.0f;  // a `user` tensor: the application's to fill
  for (std::size_t k = 0; k < a.parameter_count(); ++k) a.gradient_span()[k] = 1.0f;
  a.init(42);
  b.init(42);
  CHECK(a.seed() == 42);
  CHECK(a.tensor("head/bias").param[1] == 7.0f);  // init never writes `user` tensors
  CHECK(a.tensor("head/bias").param[0] == 0.0f);
  for (float v : a.gradient_span()) CHECK(v == 0.0f);  // init zeroes the gradients
  for (std::size_t k = 0; k < 72; ++k) CHECK(a.parameter_span()[k] == b.parameter_span()[k]);
  const auto ew = a.tensor("encoder/weight");
  const double bound = std::sqrt(6.0 / 5.0);  // Kaiming uniform, fan_in 5
  double sum_sq = 0;
  bool any_nonzero = false;
  for (std::size_t k = 0; k < ew.count; ++k) {
    CHECK(std::fabs(ew.param[k]) <= bound);
    any_nonzero = any_nonzero || ew.param[k] != 0.0f;
  }
  CHECK(any_nonzero);
  for (std::size_t k = 0; k < 8; ++k) CHECK(a.tensor("encoder/bias").param[k] == 0.0f);
  const auto hw = a.tensor("head/weight");
  for (std::size_t k = 0; k < hw.count; ++k) sum_sq += double(hw.param[k]) * hw.param[k];
  CHECK(sum_sq > 0);
  b.init(43);
  bool differs = false;
  for (std::size_t k = 0; k < 40; ++k)
    differs = differs || a.parameter_span()[k] != b.parameter_span()[k];
  CHECK(differs);
  // Xavier and Kaiming on a [fan_out, fan_in, receptive] tensor: fan_in = 4*3, fan_out = 2*3.
  ParameterSet conv({{"k", {2, 4, 3}, ParameterInit::xavier_uniform}});
  conv.init(1);
  for (float v : conv.parameter_span()) CHECK(std::fabs(v) <= std::sqrt(6.0 / (12 + 6)));
}

TEST_CASE("own_model: adopted buffers are the arenas, untouched until init") {
  std::vector<float> p(6, 5.0f), g(6, 9.0f);
  ParameterSet set(BufferView(span<float>(p)), BufferView(span<float>(g)),
                   {{"w", {2, 2}, ParameterInit::kaiming_normal}, {"b", {2}}});
  CHECK_FALSE(set.owns_memory());
  CHECK(set.parameters().data == p.data());
  CHECK(set.gradients().data == g.data());
  CHECK(set.tensor("b").param == p.data() + 4);
  for (float v : p) CHECK(v == 5.0f);
  for (float v : g) CHECK(v == 9.0f);
  set.init(3);
  CHECK(p[4] == 5.0f);  // `user` tensor kept
  CHECK(p[0] != 5.0f);
  for (float v : g) CHECK(v == 0.0f);

  using test::contains;
  using test::invalid_argument_text;
  std::vector<float> short_p(5);
  std::vector<double> dp(6);
  const std::vector<ParameterSpec> specs{{"w", {2, 2}}, {"b", {2}}};
  CHECK(contains(invalid_argument_text([&] {
                   ParameterSet s(BufferView(span<float>(short_p)), BufferView(span<float>(g)),
                                  specs);
                 }),
                 "parameter buffer has 5 elements, the tensors 6"));
  CHECK(contains(invalid_argument_text([&] {
                   ParameterSet s(BufferView(span<double>(dp)), BufferView(span<float>(g)), specs);
                 }),
                 "parameter buffer holds f64"));
  CHECK(contains(invalid_argument_text([&] {
                   ParameterSet s(BufferView(span<float>(g)), BufferView(span<float>(g)), specs);
                 }),
                 "same buffer"));
}

namespace {
// Counts the bytes it has handed out and not taken back.
struct LiveBytes final : Allocator {
  std::size_t live = 0;
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    live += bytes;
    return default_allocator().allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    live -= bytes;
    default_allocator().deallocate(p, bytes);
  }
  Space space() const noexcept override { return Space::host; }
};
}  // namespace

TEST_CASE("own_model: a set keeps no host copy of the parameters after init") {
  LiveBytes alloc;
  {
    // Owned arenas: the two arenas only, after construction and after another init.
    ParameterSet set(mlp_specs(), alloc);
    const std::size_t arenas = 2 * set.parameter_count() * sizeof(float);
    CHECK(alloc.live == arenas);
    set.init(5);
    CHECK(alloc.live == arenas);
    CHECK(set.tensor("scale").param[0] == 1.0f);  // init did draw
  }
  CHECK(alloc.live == 0);
  // Every tensor the application's: nothing of the set's own in memory after init.
  std::vector<float> p(76, 2.0f), g(76);
  HostExec exec(alloc);
  ParameterSet adopted(BufferView(span<float>(p)), BufferView(span<float>(g)), mlp_specs(), exec);
  adopted.init(5);
  CHECK(alloc.live == 0);
  CHECK(p[75] == 1.0f);
  CHECK(p[72] == 2.0f);  // "head/bias", a `user` tensor, kept
}

TEST_CASE("own_model: grad_ready reports each tensor's arena range, in the order called") {
  ParameterSet set({{"a", {3, 2}}, {"empty", {0, 4}}, {"b", {5}}});
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  auto sink = [&](std::size_t o, std::size_t c) { seen.emplace_back(o, c); };
  set.grad_ready(2, sink);
  set.grad_ready("empty", sink);  // nothing to report
  set.grad_ready("a", sink);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::make_pair(std::size_t{6}, std::size_t{5}));
  CHECK(seen[1] == std::make_pair(std::size_t{0}, std::size_t{6}));
}

TEST_CASE("own_model: AdamW and clipping on a set give the bits they give on a Sequential") {
  const std::int64_t in = 5, out = 3, rows = 7;
  Sequential seq{Linear(in, out)};
  seq.init(11);
  ParameterSet set({{"layers/0_linear/weight", {out, in}}, {"layers/0_linear/bias", {out}}});
  REQUIRE(set.parameter_count() == seq.parameter_count());
  for (std::size_t i = 0; i < set.size(); ++i) {
    CHECK(set.parameter_info()[i].name == seq.parameter_info()[i].name);
    CHECK(set.parameter_info()[i].offset == seq.parameter_info()[i].offset);
    CHECK(set.parameter_info()[i].shape == seq.parameter_info()[i].shape);
  }
  std::memcpy(set.parameter_span().data(), seq.parameter_span().data(),
              seq.parameter_span().size() * sizeof(float));

  const auto schedule = Schedule::warmup_cosine(0.05, 2, 6);
  AdamW opt_seq(seq, schedule), opt_set(set, schedule);
  RngStream rng(5, 0);
  std::vector<float> x(rows * in), t(rows * out);
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    for (auto& v : t) v = static_cast<float>(3 * rng.normal());
    seq.zero_grad();
    const double seq_loss = seq.forward_backward(x.data(), t.data(), rows, Loss::mse);
    const auto w = set.tensor(0), b = set.tensor(1);
    const double loss =
        linear_mse_by_hand(w.param, b.param, x.data(), t.data(), rows, in, out, w.grad, b.grad);
    CHECK(loss == doctest::Approx(seq_loss).epsilon(1e-5));
    // The hand-written gradients are the model's, to rounding (the layout is the same) ...
    for (std::size_t k = 0; k < set.parameter_count(); ++k)
      CHECK(set.gradient_span()[k] ==
            doctest::Approx(seq.gradient_span()[k]).epsilon(1e-4).scale(1e-6));
    // ... and given the same bits, clipping and the update give the same bits.
    std::memcpy(seq.gradient_span().data(), set.gradient_span().data(),
                set.parameter_count() * sizeof(float));
    const double n_set = clip_grad_norm(set.gradients(), 0.5);
    const double n_seq = clip_grad_norm(seq.gradients(), 0.5);
    CHECK(n_set == n_seq);
    opt_set.step();
    opt_seq.step();
    CHECK(std::memcmp(set.parameter_span().data(), seq.parameter_span().data(),
                      set.parameter_count() * sizeof(float)) == 0);
  }
  CHECK(opt_set.step_count() == 6);
  // SGD with momentum as well.
  Sgd sgd_set(set, 0.1, SgdOptions{0.9, 0.0, 1e-3, true}),
      sgd_seq(seq, 0.1, SgdOptions{0.9, 0.0, 1e-3, true});
  for (int step = 0; step < 3; ++step) {
    sgd_set.step();
    sgd_seq.step();
  }
  CHECK(std::memcmp(set.parameter_span().data(), seq.parameter_span().data(),
                    set.parameter_count() * sizeof(float)) == 0);
}

TEST_CASE("own_model: the state protocol writes a Sequential's layout; each restores the other") {
  Sequential seq{Linear(4, 6), Tanh(), Linear(6, 2)};
  seq.init(9);
  std::vector<ParameterSpec> specs;
  for (const auto& p : seq.parameter_info()) specs.push_back({p.name, p.shape});
  ParameterSet set(specs);

  test::MemoryState saved;
  seq.visit_state(saved);
  saved.load = true;
  set.visit_state(saved);
  CHECK(set.seed() == 9);
  CHECK(std::memcmp(set.parameter_span().data(), seq.parameter_span().data(),
                    set.parameter_count() * sizeof(float)) == 0);

  // The set's own save has the same entries, names and shapes as the model's.
  for (auto& v : set.parameter_span()) v *= 0.5f;
  test::MemoryState mine;
  set.visit_state(mine);
  CHECK(mine.shapes == saved.shapes);
  CHECK(mine.ints.size() == saved.ints.size());
  CHECK(mine.ints.count("seed") == 1);
  CHECK(mine.ints.count("step_count") == 1);
  mine.load = true;
  Sequential back{Linear(4, 6), Tanh(), Linear(6, 2)};
  back.visit_state(mine);
  CHECK(std::memcmp(back.parameter_span().data(), set.parameter_span().data(),
                    set.parameter_count() * sizeof(float)) == 0);

  // Round trip of a set with its own names, owned and adopted.
  ParameterSet a(mlp_specs());
  a.init(77);
  test::MemoryState sa;
  a.visit_state(sa);
  sa.load = true;
  std::vector<float> p(a.parameter_count(), -1.0f), g(a.parameter_count());
  ParameterSet b(BufferView(span<float>(p)), BufferView(span<float>(g)), mlp_specs());
  b.visit_state(sa);
  CHECK(b.seed() == 77);
  CHECK(std::memcmp(p.data(), a.parameter_span().data(), p.size() * sizeof(float)) == 0);
}

}  // namespace dtrain_test_own_model_test
