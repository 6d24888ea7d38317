// Host kernels: every fast path against its serial reference and against hand-computed values.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/kernels/host/convert.hpp>
#include <dtrain/kernels/host/dropout.hpp>
#include <dtrain/kernels/host/gemm.hpp>
#include <dtrain/kernels/host/layernorm.hpp>
#include <dtrain/kernels/host/loss.hpp>
#include <dtrain/kernels/host/memory.hpp>
#include <dtrain/kernels/host/optim.hpp>
#include <dtrain/kernels/host/reduce.hpp>
#if defined(DTRAIN_HAVE_CBLAS)
#include <dtrain/kernels/host/blas.hpp>
#endif

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_kernels_host_test {

namespace host = dtrain::host;

namespace {
template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  dtrain::RngStream rng(seed, 7);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(lo + (hi - lo) * rng.uniform_double());
  return v;
}
template <class T>
double max_rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::max(worst, d / std::max(1.0, std::abs(static_cast<double>(b[i]))));
  }
  return worst;
}
}  // namespace

TEST_CASE("gemm reference matches a hand-computed product") {
  // A = [[1 2 3],[4 5 6]], B = [[7 8],[9 10],[11 12]] -> AB = [[58 64],[139 154]].
  const double a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};
  double c[4] = {1, 1, 1, 1};
  host::ref::gemm<double>(false, false, 2, 2, 3, 1.0, a, 3, b, 2, 2.0, c, 2);
  CHECK(c[0] == 60);
  CHECK(c[1] == 66);
  CHECK(c[2] == 141);
  CHECK(c[3] == 156);
  // A^T B^T with A stored 3x2 and B stored 2x3 gives the same product.
  const double at[] = {1, 4, 2, 5, 3, 6}, bt[] = {7, 9, 11, 8, 10, 12};
  double d[4];
  host::ref::gemm<double>(true, true, 2, 2, 3, 1.0, at, 2, bt, 3, 0.0, d, 2);
  CHECK(d[0] == 58);
  CHECK(d[3] == 154);
}

TEST_CASE_TEMPLATE("gemm fast paths match the reference on odd shapes", T, float, double) {
  const std::int64_t shapes[][3] = {{1, 1, 1},    {1, 7, 3},     {5, 1, 9},     {3, 5, 1},
                                    {17, 33, 65}, {64, 70, 300}, {130, 9, 513}, {2, 600, 5}};
  std::uint64_t seed = 1;
  for (auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (T beta : {T(0), T(1), T(0.5)}) {
          const std::int64_t m = s[0], n = s[1], k = s[2];
          // Padded leading dimensions exercise the strides.
          const std::int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
          const auto a = random_vec<T>(static_cast<std::size_t>((ta ? k : m) * lda), seed++);
          const auto b = random_vec<T>(static_cast<std::size_t>((tb ? n : k) * ldb), seed++);
          auto c0 = random_vec<T>(static_cast<std::size_t>(m * ldc), seed++);
          auto c1 = c0, c2 = c0;
          [[maybe_unused]] const auto c0_in = c0;
          const T alpha = T(0.75);
          host::ref::gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c0.data(),
                             ldc);
          host::gemm_blocked<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                                c1.data(), ldc);
          host::gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c2.data(), ldc);
#if defined(DTRAIN_HAVE_CBLAS)
          auto c3 = c0_in;
          dtrain::blas::gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                                c3.data(), ldc);
#endif
          const double tol = std::is_same_v<T, float> ? 2e-5 * std::sqrt(double(k)) : 1e-13 * k;
          INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                    << " beta=" << beta);
          CHECK(max_rel_diff(c1, c0) < tol);
          CHECK(max_rel_diff(c2, c0) < tol);
#if defined(DTRAIN_HAVE_CBLAS)
          CHECK(max_rel_diff(c3, c0) < tol);
          // host::gemm's automatic path is CBLAS, bit for bit, once blas.hpp registered it.
          CHECK(std::memcmp(c3.data(), c2.data(), c3.size() * sizeof(T)) == 0);
#else
          // Without a registered BLAS it is the blocked kernel, bit for bit.
          CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(T)) == 0);
#endif
          auto c4 = c0_in;
          host::gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c4.data(), ldc,
                        host::GemmPath::blocked);
          CHECK(std::memcmp(c1.data(), c4.data(), c1.size() * sizeof(T)) == 0);
        }
}

TEST_CASE("gemm with beta 0 ignores NaN in C and rejects bad leading dimensions") {
  const float a[] = {1, 2}, b[] = {3, 4};
  float c[1] = {std::numeric_limits<float>::quiet_NaN()};
  host::gemm_blocked<float>(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, c, 1);
  CHECK(c[0] == 11.0f);
  c[0] = std::numeric_limits<float>::quiet_NaN();
  host::gemm<float>(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, c, 1);
  CHECK(c[0] == 11.0f);
  CHECK_THROWS_AS(host::gemm_blocked<float>(false, false, 2, 2, 2, 1.0f, a, 1, b, 2, 0.0f, c, 2),
                  dtrain::InvalidArgument);
  c[0] = std::numeric_limits<float>::quiet_NaN();
  host::gemm<float>(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, c, 1, host::GemmPath::reference);
  CHECK(c[0] == 11.0f);
}

TEST_CASE("activations: known values and fast path against the reference") {
  // GELU(x) = x * Phi(x): Phi(1) = 0.841344746068543, Phi(-2) = 0.0227501319481792.
  CHECK(host::detail::gelu(1.0) == doctest::Approx(0.841344746068543).epsilon(1e-14));
  CHECK(host::detail::gelu(-2.0) == doctest::Approx(-0.0455002638963584).epsilon(1e-13));
  for (auto f : {host::Activation::identity, host::Activation::relu, host::Activation::gelu,
                 host::Activation::tanh}) {
    const std::size_t n = 1001;
    auto x = random_vec<float>(n, 11, -4, 4);
    auto dy = random_vec<float>(n, 12);
    std::vector<float> y0(n), y1(n), dx0(n), dx1(n);
    host::ref::activation_forward(f, x.data(), y0.data(), n);
    host::activation_forward(f, x.data(), y1.data(), n);
    host::ref::activation_backward(f, x.data(), y0.data(), dy.data(), dx0.data(), n);
    host::activation_backward(f, x.data(), y1.data(), dy.data(), dx1.data(), n);
    INFO(host::name_of(f));
    CHECK(max_rel_diff(y1, y0) < 1e-6);
    CHECK(max_rel_diff(dx1, dx0) < 1e-6);
  }
  // In place forward.
  std::vector<double> v = {-1, 0, 2};
  host::activation_forward(host::Activation::relu, v.data(), v.data(), v.size());
  CHECK(v == std::vector<double>{0, 0, 2});
}

TEST_CASE("bias add and bias gradient") {
  const std::int64_t rows = 3, cols = 5;
  auto y = random_vec<double>(rows * cols, 3);
  auto b = random_vec<double>(cols, 4);
  auto y0 = y;
  host::bias_add(y.data(), b.data(), rows, cols);
  host::ref::bias_add(y0.data(), b.data(), rows, cols);
  CHECK(max_rel_diff(y, y0) == 0);
  std::vector<double> db(cols, 1.0), db0(cols, 1.0);
  host::bias_grad(y.data(), db.data(), rows, cols);
  host::ref::bias_grad(y.data(), db0.data(), rows, cols);
  CHECK(max_rel_diff(db, db0) < 1e-15);
  CHECK(db[2] == doctest::Approx(1.0 + y[2] + y[7] + y[12]));
}

TEST_CASE("softmax cross-entropy: known value, stability and reference") {
  // Equal logits: loss is log(C) whatever their size; gradient (1/C - onehot)/rows.
  const float z[] = {1e4f, 1e4f, 1e4f, 1e4f};
  const std::int32_t lab[] = {2};
  float dz[4];
  const double l = host::softmax_cross_entropy(z, lab, 1, 4, dz);
  CHECK(l == doctest::Approx(std::log(4.0)).epsilon(1e-6));
  CHECK(dz[0] == doctest::Approx(0.25));
  CHECK(dz[2] == doctest::Approx(-0.75));
  // Large negative logits do not overflow either.
  const float zz[] = {-1e30f, 0.0f};
  const std::int32_t l1[] = {1};
  CHECK(host::softmax_cross_entropy(zz, l1, 1, 2, static_cast<float*>(nullptr)) ==
        doctest::Approx(0.0));
  for (std::int64_t classes : {1, 2, 10, 33}) {
    const std::int64_t rows = 7;
    auto logits = random_vec<double>(rows * classes, 5, -20, 20);
    std::vector<std::int32_t> labels(rows);
    for (std::int64_t r = 0; r < rows; ++r)
      labels[r] = static_cast<std::int32_t>((r * 5) % classes);
    std::vector<double> g0(logits.size()), g1(logits.size());
    const double a = host::ref::softmax_cross_entropy(logits.data(), labels.data(), rows, classes,
                                                      g0.data(), 0.5);
    const double b =
        host::softmax_cross_entropy(logits.data(), labels.data(), rows, classes, g1.data(), 0.5);
    CHECK(a == doctest::Approx(b).epsilon(1e-13));
    CHECK(max_rel_diff(g1, g0) < 1e-14);
    // In place: dlogits aliases logits.
    auto inplace = logits;
    host::softmax_cross_entropy(inplace.data(), labels.data(), rows, classes, inplace.data(), 0.5);
    CHECK(max_rel_diff(inplace, g0) < 1e-14);
  }
  const std::int32_t bad[] = {4};
  CHECK_THROWS_AS(host::softmax_cross_entropy(z, bad, 1, 4, dz), dtrain::InvalidArgument);
}

TEST_CASE("mse against the reference and a hand value") {
  const double p[] = {1, 2, 3}, t[] = {1, 0, 4};
  double d[3];
  CHECK(host::mse(p, t, 1, 3, d) == doctest::Approx(5.0 / 3.0));
  CHECK(d[1] == doctest::Approx(4.0 / 3.0));
  double d0[3];
  CHECK(host::ref::mse(p, t, 3, 1, d0) == doctest::Approx(5.0 / 3.0));
  CHECK(d0[2] == doctest::Approx(d[2]));
}

TEST_CASE_TEMPLATE("layernorm fast path against the reference", T, float, double) {
  for (std::int64_t cols : {1, 2, 7, 64}) {
    const std::int64_t rows = 5;
    auto x = random_vec<T>(rows * cols, 21, -3, 5);
    auto g = random_vec<T>(cols, 22, 0.5, 1.5), b = random_vec<T>(cols, 23);
    auto dy = random_vec<T>(rows * cols, 24);
    std::vector<T> y0(x.size()), y1(x.size()), m0(rows), m1(rows), r0(rows), r1(rows);
    host::ref::layernorm_forward(x.data(), g.data(), b.data(), y0.data(), m0.data(), r0.data(),
                                 rows, cols, 1e-5);
    host::layernorm_forward(x.data(), g.data(), b.data(), y1.data(), m1.data(), r1.data(), rows,
                            cols, 1e-5);
    const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
    CHECK(max_rel_diff(y1, y0) < tol);
    std::vector<T> dx0(x.size()), dx1(x.size()), dg0(cols, T(1)), dg1(cols, T(1)), db0(cols),
        db1(cols);
    host::ref::layernorm_backward(x.data(), g.data(), m0.data(), r0.data(), dy.data(), dx0.data(),
                                  dg0.data(), db0.data(), rows, cols);
    host::layernorm_backward(x.data(), g.data(), m1.data(), r1.data(), dy.data(), dx1.data(),
                             dg1.data(), db1.data(), rows, cols);
    CHECK(max_rel_diff(dx1, dx0) < tol * 10);
    CHECK(max_rel_diff(dg1, dg0) < tol * 10);
    CHECK(max_rel_diff(db1, db0) < tol * 10);
    // Each normalised row has mean beta-free zero and unit variance when gamma = 1, beta = 0.
    std::vector<T> ones(cols, T(1)), zeros(cols, T(0));
    host::layernorm_forward(x.data(), ones.data(), zeros.data(), y1.data(), m1.data(), r1.data(),
                            rows, cols, 0.0 + 1e-12);
    if (cols > 1) {
      double mu = 0, var = 0;
      for (std::int64_t c = 0; c < cols; ++c) mu += y1[c];
      mu /= cols;
      for (std::int64_t c = 0; c < cols; ++c) var += (y1[c] - mu) * (y1[c] - mu);
      CHECK(std::abs(mu) < 1e-5);
      CHECK(var / cols == doctest::Approx(1.0).epsilon(1e-4));
    }
  }
}

TEST_CASE("dropout masks depend only on (seed, step, sample, element)") {
  const std::int64_t rows = 6, cols = 37;
  const float p = 0.3f;
  auto x = random_vec<float>(rows * cols, 31, 0.5, 1.5);  // never zero, so zeros mark drops
  std::vector<float> whole(x.size()), parts(x.size());
  host::dropout_forward(x.data(), whole.data(), rows, cols, p, 99, 5, 100);
  // Same samples as two batches (rows 0-1 then 2-5), as two ranks would see them.
  host::dropout_forward(x.data(), parts.data(), 2, cols, p, 99, 5, 100);
  host::dropout_forward(x.data() + 2 * cols, parts.data() + 2 * cols, 4, cols, p, 99, 5, 102);
  CHECK(whole == parts);
  // Explicit ids give the same as offsets.
  const std::int64_t ids[] = {100, 101, 102, 103, 104, 105};
  std::vector<float> by_id(x.size());
  host::dropout_forward(x.data(), by_id.data(), rows, cols, p, 99, 5, 0, ids);
  CHECK(by_id == whole);
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool keep = host::dropout_keep(99, 5, 100 + i / cols, i % cols, p);
    CHECK((whole[i] != 0.0f) == keep);
    if (keep) CHECK(whole[i] == doctest::Approx(x[i] / (1 - p)));
    dropped += !keep;
  }
  // The documented counter layout, through the Philox class (the mask function shares only the
  // Philox rounds with it): hi = step, lo = sample * 2^32 + element / 4, word element % 4.
  const dtrain::Philox gen(99);
  for (std::uint64_t s = 100; s < 106; ++s)
    for (std::uint64_t e = 0; e < static_cast<std::uint64_t>(cols); ++e) {
      const auto block = gen(5, (s << 32) + (e >> 2));
      CHECK(host::dropout_keep(99, 5, s, e, p) == (dtrain::u32_to_unit_float(block[e & 3u]) >= p));
    }
  // 222 Bernoulli(0.3) draws: mean 66.6, sd 6.8.
  CHECK(dropped > 40);
  CHECK(dropped < 95);
  // Another step or seed gives another mask.
  std::vector<float> other(x.size());
  host::dropout_forward(x.data(), other.data(), rows, cols, p, 99, 6, 100);
  CHECK(other != whole);
  // Backward applies the same mask.
  std::vector<float> ones(x.size(), 1.0f), dx(x.size());
  host::dropout_backward(ones.data(), dx.data(), rows, cols, p, 99, 5, 100);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK((dx[i] != 0.0f) == (whole[i] != 0.0f));
  CHECK_THROWS_AS(host::dropout_forward(x.data(), other.data(), rows, cols, 1.0f, 1, 1, 0),
                  dtrain::InvalidArgument);
}

TEST_CASE_TEMPLATE("optimizer kernels: fast path against the reference", T, float, double) {
  const std::size_t n = 257;
  auto p0 = random_vec<T>(n, 41), g = random_vec<T>(n, 42), buf0 = random_vec<T>(n, 43);
  for (bool nesterov : {false, true})
    for (bool first : {false, true}) {
      host::SgdParams h;
      h.lr = 0.05;
      h.momentum = 0.9;
      h.weight_decay = 0.01;
      h.nesterov = nesterov;
      h.first_step = first;
      auto pa = p0, pb = p0, ba = buf0, bb = buf0;
      host::ref::sgd_update(pa.data(), g.data(), ba.data(), n, h);
      host::sgd_update(pb.data(), g.data(), bb.data(), n, h);
      CHECK(max_rel_diff(pb, pa) < (std::is_same_v<T, float> ? 1e-6 : 1e-14));
      CHECK(max_rel_diff(bb, ba) < (std::is_same_v<T, float> ? 1e-6 : 1e-14));
    }
  auto m0 = random_vec<T>(n, 44), v0 = random_vec<T>(n, 45, 0, 1);
  host::AdamWParams h;
  h.lr = 1e-2;
  h.step = 3;
  auto pa = p0, pb = p0, ma = m0, mb = m0, va = v0, vb = v0;
  host::ref::adamw_update(pa.data(), g.data(), ma.data(), va.data(), n, h);
  host::adamw_update(pb.data(), g.data(), mb.data(), vb.data(), n, h);
  CHECK(max_rel_diff(pb, pa) < (std::is_same_v<T, float> ? 1e-6 : 1e-14));
  CHECK(max_rel_diff(mb, ma) < (std::is_same_v<T, float> ? 1e-6 : 1e-14));
  CHECK(max_rel_diff(vb, va) < (std::is_same_v<T, float> ? 1e-6 : 1e-14));
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The SGD hyper-parameters of the bit-for-bit tests: dampening and weight decay both non-zero.
host::SgdParams sgd_test_params(double momentum, bool nesterov, bool first) {
  host::SgdParams h;
  h.lr = 0.05;
  h.momentum = momentum;
  h.dampening = 0.25;  // 1 - dampening differs from momentum, so swapping the two shows
  h.weight_decay = 0.01;
  h.nesterov = nesterov;
  h.first_step = first;
  return h;
}

// The documented updates, written out here independently of the library in T arithmetic. They
// are compiled without floating-point contraction, as the library's own loops are
// (<dtrain/kernels/host/optim.hpp>: the pragmas, and DTRAIN_HOST_NO_CONTRACT under nvcc): under
// -march=native a fused multiply-add would round them differently from the scalar order.
#if defined(__clang__)
#pragma float_control(push)
#pragma clang fp contract(off)
#elif defined(__GNUC__) && !defined(__NVCC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
namespace {
template <class T>
DTRAIN_HOST_NO_CONTRACT void documented_adamw(std::vector<T>& p, const std::vector<T>& g,
                                              std::vector<T>& m, std::vector<T>& v,
                                              const host::AdamWParams& h) {
  const double t = static_cast<double>(h.step);
  const T b1 = T(h.beta1), b2 = T(h.beta2), c1 = T(1.0 - h.beta1), c2 = T(1.0 - h.beta2);
  const T decay = T(1.0 - h.lr * h.weight_decay), eps = T(h.eps);
  const T step_size = T(h.lr / (1.0 - std::pow(h.beta1, t)));
  const T inv_bc2 = T(1.0 / (1.0 - std::pow(h.beta2, t)));
  for (std::size_t i = 0; i < p.size(); ++i) {
    const T mi = b1 * m[i] + c1 * g[i];
    const T vi = b2 * v[i] + c2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi * inv_bc2) + eps);
  }
}
// `damp` is 1 - dampening, given in T.
template <class T>
DTRAIN_HOST_NO_CONTRACT void documented_sgd(std::vector<T>& p, const std::vector<T>& g,
                                            std::vector<T>& b, const host::SgdParams& h, T damp) {
  const T lr = T(h.lr), wd = T(h.weight_decay), mu = T(h.momentum);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const T d = g[i] + wd * p[i];
    if (h.momentum == 0.0) {
      p[i] -= lr * d;
      continue;
    }
    const T bi = h.first_step ? d : mu * b[i] + damp * d;
    b[i] = bi;
    p[i] -= lr * (h.nesterov ? d + mu * bi : bi);
  }
}
}  // namespace
#if defined(__clang__)
#pragma float_control(pop)
#elif defined(__GNUC__) && !defined(__NVCC__)
#pragma GCC pop_options
#endif

TEST_CASE_TEMPLATE("optimizer fast paths give the documented scalar update bit for bit", T, float,
                   double) {
  // Sizes around every SIMD width and remainder, and a large odd one.
  for (std::size_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 17, 1000, 4099}) {
    const auto p0 = random_vec<T>(n, 61, -2, 2), g = random_vec<T>(n, 62, -3, 3);
    const auto m0 = random_vec<T>(n, 63), v0 = random_vec<T>(n, 64, 0, 2);
    for (long long step : {1LL, 2LL, 1000LL}) {
      host::AdamWParams h;
      h.lr = 3e-3;
      h.weight_decay = 0.05;
      h.step = step;
      auto pw = p0, mw = m0, vw = v0;
      documented_adamw(pw, g, mw, vw, h);
      auto pf = p0, mf = m0, vf = v0, ps = p0, ms = m0, vs = v0;
      host::adamw_update(pf.data(), g.data(), mf.data(), vf.data(), n, h);
      host::adamw_update_scalar(ps.data(), g.data(), ms.data(), vs.data(), n, h);
      INFO("adamw n=" << n << " step=" << step);
      CHECK(same_bits(pf, pw));
      CHECK(same_bits(mf, mw));
      CHECK(same_bits(vf, vw));
      CHECK(same_bits(ps, pw));
    }
    const auto b0 = random_vec<T>(n, 65);
    for (double momentum : {0.0, 0.9})
      for (bool nesterov : {false, true})
        for (bool first : {false, true}) {
          const host::SgdParams h = sgd_test_params(momentum, nesterov, first);
          auto pw = p0, bw = b0;
          documented_sgd(pw, g, bw, h, T(0.75));
          auto pf = p0, bf = b0, ps = p0, bs = b0;
          host::sgd_update(pf.data(), g.data(), momentum != 0.0 ? bf.data() : nullptr, n, h);
          host::sgd_update_scalar(ps.data(), g.data(), momentum != 0.0 ? bs.data() : nullptr, n, h);
          INFO("sgd n=" << n << " momentum=" << momentum << " nesterov=" << nesterov
                        << " first=" << first);
          CHECK(same_bits(pf, pw));
          CHECK(same_bits(bf, bw));
          CHECK(same_bits(ps, pw));
        }
  }
}

namespace {
// Restores the optimizer kernels' SIMD limit when a test case ends, whatever happened in it.
struct HostSimdLimitGuard {
  host::detail::HostSimd saved = host::detail::host_simd_limit();
  ~HostSimdLimitGuard() { host::detail::host_simd_limit() = saved; }
};

// AdamW inputs that reach every branch of the arithmetic: zeros in g, m and v (the denominator is
// eps alone), tiny and large magnitudes, both signs.
template <class T>
void adamw_edge_inputs(std::vector<T>& p, std::vector<T>& g, std::vector<T>& m, std::vector<T>& v,
                       std::size_t n, std::uint64_t seed) {
  p = random_vec<T>(n, seed, -2, 2);
  g = random_vec<T>(n, seed + 1, -3, 3);
  m = random_vec<T>(n, seed + 2);
  v = random_vec<T>(n, seed + 3, 0, 2);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) g[i] = 0;
    if (i % 5 == 1) v[i] = 0;
    if (i % 7 == 2) m[i] = 0;
    if (i % 11 == 3) g[i] = static_cast<T>(g[i] * T(1e-30));
    if (i % 13 == 4) g[i] = static_cast<T>(g[i] * T(1e15));
    if (i % 17 == 5) v[i] = static_cast<T>(v[i] * T(1e-30));
  }
}
}  // namespace

TEST_CASE("the optimizer kernels' AVX detection agrees with the kernel's CPU flags") {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) break;
  if (line.rfind("flags", 0) != 0) {
    MESSAGE("not checked: /proc/cpuinfo has no flags line on this machine");
    return;
  }
  std::istringstream words(line.substr(line.find(':') + 1));
  bool avx = false;
  for (std::string w; words >> w;) avx = avx || w == "avx";
  INFO("/proc/cpuinfo flags: " << line);
  CHECK(host::detail::cpu_has_avx() == avx);
}

TEST_CASE_TEMPLATE("AdamW's AVX and SSE2 lanes give the scalar loop's bits", T, float, double) {
  HostSimdLimitGuard guard;
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 40; ++n) sizes.push_back(n);
  sizes.push_back(1000);
  sizes.push_back(4099);
  for (const auto limit : {host::detail::HostSimd::sse2, host::detail::HostSimd::avx}) {
    const bool avx = limit == host::detail::HostSimd::avx;
    const std::string path = avx ? "avx" : "sse2";
    if (avx && !host::detail::cpu_has_avx()) {
      MESSAGE("AVX lanes skipped, not checked: this CPU (or its OS) does not support AVX");
      continue;
    }
    host::detail::host_simd_limit() = limit;
    REQUIRE(host::detail::host_simd_avx() == avx);
    for (const std::size_t n : sizes)
      for (const std::size_t offset : {0, 1}) {  // offset 1: every lane load and store unaligned
        std::vector<T> p0, g0, m0, v0;
        adamw_edge_inputs(p0, g0, m0, v0, n + offset, 70 + n);
        auto pf = p0, mf = m0, vf = v0, ps = p0, ms = m0, vs = v0;
        for (long long step = 1; step <= 4; ++step) {
          host::AdamWParams h;
          h.lr = 3e-3;
          h.weight_decay = 0.05;
          h.step = step;
          host::adamw_update(pf.data() + offset, g0.data() + offset, mf.data() + offset,
                             vf.data() + offset, n, h);
          host::adamw_update_scalar(ps.data() + offset, g0.data() + offset, ms.data() + offset,
                                    vs.data() + offset, n, h);
        }
        INFO("adamw " << path << " n=" << n << " offset=" << offset);
        CHECK(same_bits(pf, ps));
        CHECK(same_bits(mf, ms));
        CHECK(same_bits(vf, vs));
        if (n > 0) CHECK(!same_bits(pf, p0));  // the update moved p: not a no-op comparison
      }
  }
}

TEST_CASE_TEMPLATE("SGD's AVX and SSE2 loops give the scalar loop's bits", T, float, double) {
  HostSimdLimitGuard guard;
  for (const auto limit : {host::detail::HostSimd::sse2, host::detail::HostSimd::avx}) {
    const bool avx = limit == host::detail::HostSimd::avx;
    if (avx && !host::detail::cpu_has_avx()) {
      MESSAGE("SGD AVX loop skipped, not checked: this CPU (or its OS) does not support AVX");
      continue;
    }
    host::detail::host_simd_limit() = limit;
    const std::string path = avx ? "avx" : "sse2";
    for (const std::size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099})
      for (const std::size_t offset : {0, 1})
        for (double momentum : {0.0, 0.9})
          for (bool nesterov : {false, true}) {
            std::vector<T> p0, g0, b0, unused;
            adamw_edge_inputs(p0, g0, b0, unused, n + offset, 90 + n);
            auto pf = p0, bf = b0, ps = p0, bs = b0;
            for (int step = 0; step < 3; ++step) {
              const host::SgdParams h = sgd_test_params(momentum, nesterov, step == 0);
              T* bfp = momentum != 0.0 ? bf.data() + offset : nullptr;
              T* bsp = momentum != 0.0 ? bs.data() + offset : nullptr;
              host::sgd_update(pf.data() + offset, g0.data() + offset, bfp, n, h);
              host::sgd_update_scalar(ps.data() + offset, g0.data() + offset, bsp, n, h);
            }
            INFO("sgd " << path << " n=" << n << " offset=" << offset << " momentum=" << momentum
                        << " nesterov=" << nesterov);
            CHECK(same_bits(pf, ps));
            CHECK(same_bits(bf, bs));
            if (n > 0) CHECK(!same_bits(pf, p0));
          }
  }
}

TEST_CASE("fill, copy, axpy and sum_to: the device kernels' host references") {
  std::vector<float> x = {1.5f, -2.0f, 0.25f, 8.0f, 3.0f}, y = {1, 1, 1, 1, 1}, z(5);
  host::fill(z.data(), -0.5f, z.size());
  CHECK(z == std::vector<float>(5, -0.5f));
  host::copy(x.data(), z.data(), x.size());
  CHECK(z == x);
  host::axpy(2.0f, x.data(), y.data(), y.size());
  CHECK(y == std::vector<float>{4.0f, -3.0f, 1.5f, 17.0f, 7.0f});
  CHECK(host::sum_to(x.data(), x.size(), 0.5) == 5.375);
  CHECK(host::sum_to(x.data(), 0, 0.5) == 0.0);
}

TEST_CASE("f16 and bf16: every bit pattern round-trips exactly through f32") {
  std::vector<dtrain::half> h(65536), h2(65536);
  std::vector<dtrain::bfloat16> b(65536), b2(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i] = dtrain::half::from_bits(static_cast<std::uint16_t>(i));
    b[i] = dtrain::bfloat16::from_bits(static_cast<std::uint16_t>(i));
  }
  std::vector<float> f(65536), g(65536);
  host::convert(h.data(), f.data(), f.size());
  host::convert(f.data(), h2.data(), f.size());
  host::convert(b.data(), g.data(), g.size());
  host::convert(g.data(), b2.data(), g.size());
  std::size_t h_bad = 0, b_bad = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const bool h_nan = std::isnan(f[i]), b_nan = std::isnan(g[i]);
    // NaNs stay NaN (quiet); every other value, signed zeros and infinities included, is exact.
    if (h_nan ? !std::isnan(static_cast<float>(h2[i])) : h2[i].bits != h[i].bits) ++h_bad;
    if (b_nan ? !std::isnan(static_cast<float>(b2[i])) : b2[i].bits != b[i].bits) ++b_bad;
  }
  CHECK(h_bad == 0);
  CHECK(b_bad == 0);
}

TEST_CASE("f16 and bf16: narrowing rounds to nearest even") {
  const float in[] = {1.0f + std::ldexp(1.0f, -11),      // tie below: to 1.0
                      1.0f + 3 * std::ldexp(1.0f, -11),  // tie: to even 1+2^-9
                      65504.0f,
                      65520.0f,  // max half; rounds to inf
                      std::ldexp(1.0f, -24),
                      std::ldexp(1.0f, -25)};  // min subnormal; tie to 0
  dtrain::half out[6];
  host::convert(in, out, 6);
  CHECK(out[0].bits == 0x3c00);
  CHECK(out[1].bits == 0x3c02);
  CHECK(out[2].bits == 0x7bff);
  CHECK(out[3].bits == 0x7c00);
  CHECK(out[4].bits == 0x0001);
  CHECK(out[5].bits == 0x0000);
  const float bin[] = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8)};
  dtrain::bfloat16 bout[2];
  host::convert(bin, bout, 2);
  CHECK(bout[0].bits == 0x3f80);
  CHECK(bout[1].bits == 0x3f82);
}

TEST_CASE("reduce_into for every op and dtype") {
  using dtrain::ReduceOp;
  const float fa[] = {1, -2, 3}, fb[] = {4, 5, -6};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    float acc[3] = {fa[0], fa[1], fa[2]};
    host::reduce_into(op, dtrain::BufferView(acc, 3, dtrain::DType::f32),
                      dtrain::BufferView(const_cast<float*>(fb), 3, dtrain::DType::f32));
    for (int i = 0; i < 3; ++i) {
      float want = 0;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: want = fa[i] + fb[i]; break;
        case ReduceOp::prod: want = fa[i] * fb[i]; break;
        case ReduceOp::min: want = std::min(fa[i], fb[i]); break;
        case ReduceOp::max: want = std::max(fa[i], fb[i]); break;
      }
      CHECK(acc[i] == want);
    }
  }
  std::int64_t ia[] = {7, -7}, ib[] = {2, 2};
  host::reduce_into(ReduceOp::avg, ia, ib, 2);
  host::scale_avg(ia, 2, 2);
  CHECK(ia[0] == 4);
  CHECK(ia[1] == -2);  // -5 / 2 truncates toward zero
  dtrain::half ha[] = {dtrain::half(1.5f)}, hb[] = {dtrain::half(2.25f)};
  host::reduce_into(ReduceOp::sum, ha, hb, 1);
  CHECK(static_cast<float>(ha[0]) == 3.75f);
  dtrain::bfloat16 ba[] = {dtrain::bfloat16(3.0f)}, bb[] = {dtrain::bfloat16(-1.0f)};
  host::reduce_into(ReduceOp::max, ba, bb, 1);
  CHECK(static_cast<float>(ba[0]) == 3.0f);
  double d1[2], d2[3];
  CHECK_THROWS_AS(host::reduce_into(ReduceOp::sum, dtrain::BufferView(d1, 2, dtrain::DType::f64),
                                    dtrain::BufferView(d2, 3, dtrain::DType::f64)),
                  dtrain::InvalidArgument);
}

namespace {
// The contract's element operation, written out independently of reduce.hpp: acc (op) in.
template <class T>
T contract_op(dtrain::ReduceOp op, T acc, T in) {
  using dtrain::ReduceOp;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    if (op == ReduceOp::sum || op == ReduceOp::avg) return static_cast<T>(U(acc) + U(in));
    if (op == ReduceOp::prod) return static_cast<T>(U(acc) * U(in));
  } else {
    if (op == ReduceOp::sum || op == ReduceOp::avg) return acc + in;
    if (op == ReduceOp::prod) return acc * in;
  }
  if (op == ReduceOp::min) return in < acc ? in : acc;
  return acc < in ? in : acc;
}
}  // namespace

// The reductions run in fixed-size blocks with a remainder (elementwise.hpp): every length
// around a block, each operation, out of place and with the output equal to either input, NaN
// and signed zeros included, against the element operation applied one element at a time.
TEST_CASE_TEMPLATE("host reductions equal the element operation at every length around a block", T,
                   float, double, std::int32_t, std::int64_t) {
  using dtrain::ReduceOp;
  constexpr std::size_t block = host::detail::kElementBlockBytes / sizeof(T);
  const std::size_t lengths[] = {0,         1,         block - 1,     block,
                                 block + 1, 2 * block, 3 * block + 5, 7 * block + block / 2};
  for (std::size_t n : lengths) {
    std::vector<T> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(static_cast<long>(i * 37 % 101) - 50);
      b[i] = static_cast<T>(static_cast<long>(i * 53 % 97) - 48);
      if constexpr (std::is_floating_point_v<T>) {
        a[i] /= T(8);
        if (i % 29 == 3) a[i] = std::numeric_limits<T>::quiet_NaN();
        if (i % 31 == 5) b[i] = std::numeric_limits<T>::quiet_NaN();
        if (i % 23 == 7) a[i] = -T(0);
      } else if (i % 17 == 2) {
        a[i] = std::numeric_limits<T>::max();  // sums and products wrap
      }
    }
    for (ReduceOp op :
         {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      CAPTURE(n);
      CAPTURE(static_cast<int>(op));
      std::vector<T> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = contract_op(op, a[i], b[i]);
      std::vector<T> out(n, T(7));
      host::reduce(op, out.data(), a.data(), b.data(), n);
      CHECK(same_bits(out, want));
      std::vector<T> in_a = a, in_b = b;
      host::reduce(op, in_a.data(), in_a.data(), b.data(), n);  // output is the first operand
      CHECK(same_bits(in_a, want));
      host::reduce(op, in_b.data(), a.data(), in_b.data(), n);  // output is the second operand
      CHECK(same_bits(in_b, want));
      std::vector<T> acc = a;
      host::reduce_into(op, acc.data(), b.data(), n);
      CHECK(same_bits(acc, want));
      // reduce_store2: the reduction, an avg finished over 3 ranks, stored twice, with each
      // output distinct or equal to either input (as shm's whole-call path aliases them).
      std::vector<T> want2 = want;
      if (op == ReduceOp::avg) host::scale_avg(want2.data(), n, 3);
      std::vector<T> o0(n, T(7)), o1(n, T(9));
      host::reduce_store2(op, a.data(), b.data(), o0.data(), o1.data(), n, 3);
      CHECK(same_bits(o0, want2));
      CHECK(same_bits(o1, want2));
      std::vector<T> x0 = a, x1 = b;
      host::reduce_store2(op, x0.data(), x1.data(), x0.data(), x1.data(), n, 3);
      CHECK(same_bits(x0, want2));
      CHECK(same_bits(x1, want2));
      x0 = a, x1 = b;
      host::reduce_store2(op, x0.data(), x1.data(), x1.data(), x0.data(), n, 3);
      CHECK(same_bits(x0, want2));
      CHECK(same_bits(x1, want2));
    }
    std::vector<T> scaled = a, want_scaled(n);
    for (std::size_t i = 0; i < n; ++i) want_scaled[i] = static_cast<T>(a[i] / T(3));
    host::scale_avg(scaled.data(), n, 3);
    CHECK(same_bits(scaled, want_scaled));
  }
}

TEST_CASE_TEMPLATE("16-bit reductions widen, combine and round element by element at every length",
                   H, dtrain::half, dtrain::bfloat16) {
  using dtrain::ReduceOp;
  constexpr std::size_t block = host::detail::kElementBlockBytes / sizeof(float);
  for (std::size_t n : {std::size_t{1}, block - 1, block, block + 1, 3 * block + 5}) {
    std::vector<H> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = H(static_cast<float>(static_cast<long>(i * 37 % 101) - 50) / 7.0f);
      b[i] = H(static_cast<float>(static_cast<long>(i * 53 % 97) - 48) / 3.0f);
    }
    std::vector<float> wide(n), want_wide(n);
    host::widen(a.data(), wide.data(), n);
    for (std::size_t i = 0; i < n; ++i) want_wide[i] = static_cast<float>(a[i]);
    CHECK(same_bits(wide, want_wide));
    host::reduce_into(ReduceOp::sum, wide.data(), b.data(), n);
    for (std::size_t i = 0; i < n; ++i) want_wide[i] += static_cast<float>(b[i]);
    CHECK(same_bits(wide, want_wide));
    std::vector<H> narrow(n), acc = a;
    host::narrow(wide.data(), narrow.data(), n);
    host::reduce_into(ReduceOp::sum, acc.data(), b.data(), n);  // widen both, add, round once
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(narrow[i].bits == H(want_wide[i]).bits);
      CHECK(acc[i].bits == H(want_wide[i]).bits);
    }
  }
}

// ReLU, identity and the bias passes run in fixed-size blocks with a remainder (elementwise.hpp):
// every length around a block, bit for bit against the same operations one element at a time.
TEST_CASE_TEMPLATE("ReLU, identity and bias passes at every length around a block", T, float,
                   double) {
  constexpr std::size_t block = host::detail::kElementBlockBytes / sizeof(T);
  for (std::size_t n : {std::size_t{1}, block - 1, block, block + 1, 3 * block + 5}) {
    CAPTURE(n);
    const auto x = random_vec<T>(n, 21, -2, 2);
    const auto dy = random_vec<T>(n, 22);
    std::vector<T> want_y(n), want_dx(n);
    for (std::size_t i = 0; i < n; ++i) {
      want_y[i] = x[i] > T(0) ? x[i] : T(0);
      want_dx[i] = x[i] > T(0) ? dy[i] : T(0);
    }
    std::vector<T> y(n), dx(n), same = x;
    host::activation_forward(host::Activation::relu, x.data(), y.data(), n);
    CHECK(same_bits(y, want_y));
    host::activation_forward(host::Activation::relu, same.data(), same.data(), n);  // in place
    CHECK(same_bits(same, want_y));
    host::activation_backward(host::Activation::relu, x.data(), y.data(), dy.data(), dx.data(), n);
    CHECK(same_bits(dx, want_dx));
    std::vector<T> copy(n);
    host::activation_forward(host::Activation::identity, x.data(), copy.data(), n);
    CHECK(same_bits(copy, x));
    // Bias over `n` columns and 3 rows: added per row; the gradient sums the rows in order.
    const std::int64_t rows = 3, cols = static_cast<std::int64_t>(n);
    const auto bias = random_vec<T>(n, 23);
    auto m = random_vec<T>(3 * n, 24);
    std::vector<T> want_m = m, db(n, T(0.5)), want_db(n, T(0.5));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < n; ++c) {
        want_m[r * n + c] += bias[c];
        want_db[c] += m[r * n + c];
      }
    host::bias_grad(m.data(), db.data(), rows, cols);
    CHECK(same_bits(db, want_db));
    host::bias_add(m.data(), bias.data(), rows, cols);
    CHECK(same_bits(m, want_m));
  }
}

// fill, axpy and scale run in fixed-size blocks with a remainder too (memory.hpp): every length
// around a block. axpy's operands make alpha * x exact, so a fused multiply-add (under
// -march=native) and a multiply then add give the same bits.
TEST_CASE_TEMPLATE("fill, axpy and scale at every length around a block", T, float, double) {
  constexpr std::size_t block = host::detail::kElementBlockBytes / sizeof(T);
  for (std::size_t n : {std::size_t{1}, block - 1, block, block + 1, 3 * block + 5}) {
    CAPTURE(n);
    std::vector<T> x(n), y(n), want(n);
    host::fill(x.data(), T(-2.5), n);
    CHECK(same_bits(x, std::vector<T>(n, T(-2.5))));
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = static_cast<T>(static_cast<long>(i % 13) - 6);
      y[i] = static_cast<T>(i % 7) / T(3);
      want[i] = T(0.5) * x[i] + y[i];
    }
    host::axpy(T(0.5), x.data(), y.data(), n);
    CHECK(same_bits(y, want));
    for (std::size_t i = 0; i < n; ++i) want[i] = y[i] * T(0.7);
    host::scale(y.data(), n, T(0.7));
    CHECK(same_bits(y, want));
  }
}

}  // namespace dtrain_test_kernels_host_test
