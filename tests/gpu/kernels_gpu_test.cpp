// Device kernels against their host references on random inputs. One source for CUDA (nvcc) and
// HIP (hipcc). Without a GPU the process prints what is missing and exits 77 (skipped).
//
// Tolerances (relative, max over elements, |ref| floored at 1): elementwise kernels 2e-5 (f32) /
// 1e-12 (f64) against long-double references (device erf/tanh/exp differ from the host libm by a
// few ulp, and nvcc contracts a*b+c into FMA); reductions over k terms scale by sqrt(k) (GEMM) or
// 10-50x (column sums, layernorm statistics). Bit-exact: dropout masks and the scaled values,
// fill, copy, f16/bf16 conversions, and the reductions of the all-reduce.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
#include <dtrain/kernels/kernels.cuh>

#include "support/skip.hpp"
#include "support/watchdog.hpp"

namespace gpu = dtrain::gpu;
namespace host = dtrain::host;

namespace {
template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  dtrain::RngStream rng(seed, 11);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(lo + (hi - lo) * rng.uniform_double());
  return v;
}
template <class T>
gpu::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  gpu::DeviceBuffer<T> d(v.size());
  d.upload(v.data());
  return d;
}
template <class T>
std::vector<T> to_host(const gpu::DeviceBuffer<T>& d) {
  std::vector<T> v(d.size());
  d.download(v.data());
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
template <class T>
constexpr double tol() {
  return sizeof(T) == 4 ? 2e-5 : 1e-12;
}
}  // namespace

TEST_CASE("device reports a warp size the kernels agree with") {
  const int w = gpu::device_warp_size();
  CHECK((w == 32 || w == 64));
  MESSAGE("device 0: " << gpu::device_name() << ", warp " << w);
}

TEST_CASE_TEMPLATE("gemm: tiled kernel and vendor path match the host reference", T, float,
                   double) {
  const std::int64_t shapes[][3] = {
      {1, 1, 1}, {7, 5, 3}, {65, 63, 17}, {128, 200, 96}, {3, 513, 129}};
  std::uint64_t seed = 100;
  for (auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const std::int64_t m = s[0], n = s[1], k = s[2];
        const std::int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
        const auto a = random_vec<T>(static_cast<std::size_t>((ta ? k : m) * lda), seed++);
        const auto b = random_vec<T>(static_cast<std::size_t>((tb ? n : k) * ldb), seed++);
        const auto c = random_vec<T>(static_cast<std::size_t>(m * ldc), seed++);
        auto want = c;
        host::ref::gemm<T>(ta, tb, m, n, k, T(1.5), a.data(), lda, b.data(), ldb, T(0.5),
                           want.data(), ldc);
        auto da = to_device(a), db = to_device(b);
        for (int which = 0; which < 2; ++which) {
          auto dc = to_device(c);
          if (which == 0)
            gpu::TiledGemm{}(ta, tb, m, n, k, T(1.5), da.data(), lda, db.data(), ldb, T(0.5),
                             dc.data(), ldc, nullptr);
          else
#if defined(DTRAIN_GPU_VENDOR_BLAS)
            gpu::VendorGemm{}(ta, tb, m, n, k, T(1.5), da.data(), lda, db.data(), ldb, T(0.5),
                              dc.data(), ldc, nullptr);
#else
            continue;  // no vendor BLAS in this build
#endif
          gpu::synchronize();
          INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                    << " engine=" << (which == 0 ? "tiled" : "vendor"));
          CHECK(max_rel_diff(to_host(dc), want) < tol<T>() * std::sqrt(double(k)));
        }
      }
}

TEST_CASE_TEMPLATE("bias + activation forward and backward match the host", T, float, double) {
  const std::int64_t rows = 37, cols = 129;
  for (auto f : {host::Activation::identity, host::Activation::relu, host::Activation::gelu,
                 host::Activation::tanh}) {
    const auto z = random_vec<T>(rows * cols, 1, -3, 3), bias = random_vec<T>(cols, 2);
    const auto dy = random_vec<T>(rows * cols, 3);
    std::vector<T> pre = z, y(z.size()), dpre(z.size()), dbias(cols, T(0.25));
    host::ref::bias_add(pre.data(), bias.data(), rows, cols);
    host::ref::activation_forward(f, pre.data(), y.data(), pre.size());
    host::ref::activation_backward(f, pre.data(), y.data(), dy.data(), dpre.data(), pre.size());
    host::ref::bias_grad(dpre.data(), dbias.data(), rows, cols);
    auto dz = to_device(z), dbi = to_device(bias), ddy = to_device(dy);
    gpu::DeviceBuffer<T> dpre_d(z.size()), dy_out(z.size()), dgrad(z.size());
    auto ddb = to_device(std::vector<T>(cols, T(0.25)));
    gpu::bias_act_forward(f, dz.data(), dbi.data(), dpre_d.data(), dy_out.data(), rows, cols);
    gpu::bias_act_backward(f, dpre_d.data(), dy_out.data(), ddy.data(), dgrad.data(), ddb.data(),
                           rows, cols);
    gpu::synchronize();
    INFO(host::name_of(f));
    CHECK(max_rel_diff(to_host(dpre_d), pre) < tol<T>());
    CHECK(max_rel_diff(to_host(dy_out), y) < tol<T>());
    CHECK(max_rel_diff(to_host(dgrad), dpre) < tol<T>());
    CHECK(max_rel_diff(to_host(ddb), dbias) < tol<T>() * 10);
  }
}

TEST_CASE_TEMPLATE("unfused bias add, bias gradient and activations match the host", T, float,
                   double) {
  const std::int64_t rows = 33, cols = 67;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  for (auto f : {host::Activation::identity, host::Activation::relu, host::Activation::gelu,
                 host::Activation::tanh}) {
    const auto x = random_vec<T>(n, 21, -3, 3), bias = random_vec<T>(cols, 22);
    const auto dy = random_vec<T>(n, 23);
    std::vector<T> pre = x, y(n), dx(n), db(cols, T(0.5));
    host::ref::bias_add(pre.data(), bias.data(), rows, cols);
    host::ref::activation_forward(f, pre.data(), y.data(), n);
    host::ref::activation_backward(f, pre.data(), y.data(), dy.data(), dx.data(), n);
    host::ref::bias_grad(dx.data(), db.data(), rows, cols);
    auto d_pre = to_device(x), d_bias = to_device(bias), d_dy = to_device(dy);
    auto d_db = to_device(std::vector<T>(cols, T(0.5)));
    gpu::DeviceBuffer<T> d_y(n);
    gpu::bias_add(d_pre.data(), d_bias.data(), rows, cols);
    gpu::activation_forward(f, d_pre.data(), d_y.data(), n);
    // In place, as the layers do: dx overwrites dy.
    gpu::activation_backward(f, d_pre.data(), d_y.data(), d_dy.data(), d_dy.data(), n);
    gpu::bias_grad(d_dy.data(), d_db.data(), rows, cols);
    gpu::synchronize();
    INFO(host::name_of(f));
    CHECK(max_rel_diff(to_host(d_pre), pre) < tol<T>());
    CHECK(max_rel_diff(to_host(d_y), y) < tol<T>());
    CHECK(max_rel_diff(to_host(d_dy), dx) < tol<T>());
    CHECK(max_rel_diff(to_host(d_db), db) < tol<T>() * 10);
  }
}

TEST_CASE_TEMPLATE("dropout: the device draws the host's masks bit for bit", T, float, double) {
  const std::int64_t rows = 13, cols = 103;  // cols not a multiple of 4: partial last group
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const auto x = random_vec<T>(n, 31);
  std::vector<std::int64_t> ids(rows);
  for (std::int64_t r = 0; r < rows; ++r) ids[r] = 1000 + 7 * r;
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f})
    for (bool with_ids : {false, true}) {
      std::vector<T> want(n), want_b(n);
      host::dropout_forward(x.data(), want.data(), rows, cols, p, 42, 5, 17,
                            with_ids ? ids.data() : nullptr);
      host::dropout_backward(x.data(), want_b.data(), rows, cols, p, 42, 5, 17,
                             with_ids ? ids.data() : nullptr);
      auto dx = to_device(x);
      auto d_ids = to_device(ids);
      gpu::DeviceBuffer<T> dy(n), db(n);
      gpu::dropout_forward(dx.data(), dy.data(), rows, cols, p, 42, 5, 17,
                           with_ids ? d_ids.data() : nullptr);
      gpu::dropout_backward(dx.data(), db.data(), rows, cols, p, 42, 5, 17,
                            with_ids ? d_ids.data() : nullptr);
      gpu::synchronize();
      INFO("p=" << p << " ids=" << with_ids);
      const auto got = to_host(dy), got_b = to_host(db);
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0);
      CHECK(std::memcmp(got_b.data(), want_b.data(), n * sizeof(T)) == 0);
    }
}

TEST_CASE_TEMPLATE("mean squared error matches the host", T, float, double) {
  const std::int64_t rows = 29, cols = 11;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const auto pred = random_vec<T>(n, 41), target = random_vec<T>(n, 42);
  std::vector<T> want_d(n);
  const double want = host::ref::mse(pred.data(), target.data(), rows, cols, want_d.data(), 0.5);
  auto dp = to_device(pred), dt = to_device(target);
  gpu::DeviceBuffer<T> dd(n), sq(n);
  gpu::mse(dp.data(), dt.data(), rows, cols, dd.data(), sq.data(), 0.5);
  gpu::synchronize();
  double total = 0;
  for (T v : to_host(sq)) total += static_cast<double>(v);
  CHECK(total / static_cast<double>(n) == doctest::Approx(want).epsilon(tol<T>() * 10));
  CHECK(max_rel_diff(to_host(dd), want_d) < tol<T>());
}

TEST_CASE_TEMPLATE("fill, copy and axpy match the host", T, float, double) {
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(100003)}) {
    const auto x = random_vec<T>(n, 51), y0 = random_vec<T>(n, 52);
    std::vector<T> filled(n), copied(n), y = y0;
    host::fill(filled.data(), T(-0.375), n);
    host::copy(x.data(), copied.data(), n);
    host::axpy(T(0.25), x.data(), y.data(), n);
    auto dx = to_device(x), dy = to_device(y0);
    gpu::DeviceBuffer<T> df(n), dc(n);
    gpu::fill(df.data(), T(-0.375), n);
    gpu::copy(dx.data(), dc.data(), n);
    gpu::axpy(T(0.25), dx.data(), dy.data(), n);
    gpu::synchronize();
    INFO("n=" << n);
    CHECK(std::memcmp(to_host(df).data(), filled.data(), n * sizeof(T)) == 0);
    CHECK(std::memcmp(to_host(dc).data(), copied.data(), n * sizeof(T)) == 0);
    CHECK(max_rel_diff(to_host(dy), y) < tol<T>());
  }
}

TEST_CASE_TEMPLATE("fused softmax cross-entropy matches the host", T, float, double) {
  for (std::int64_t classes : {1, 2, 10, 1000}) {
    const std::int64_t rows = 19;
    const auto logits = random_vec<T>(rows * classes, 4, -30, 30);
    std::vector<std::int32_t> labels(rows);
    for (std::int64_t r = 0; r < rows; ++r)
      labels[r] = static_cast<std::int32_t>((r * 13) % classes);
    std::vector<T> g(logits.size());
    const double want = host::ref::softmax_cross_entropy(logits.data(), labels.data(), rows,
                                                         classes, g.data(), 0.5);
    auto dl = to_device(logits), dg = gpu::DeviceBuffer<T>(logits.size()),
         dloss = gpu::DeviceBuffer<T>(rows);
    auto dlab = to_device(labels);
    gpu::softmax_cross_entropy(dl.data(), dlab.data(), rows, classes, dg.data(), dloss.data(), 0.5);
    gpu::synchronize();
    const auto rl = to_host(dloss);
    double mean = 0;
    for (T v : rl) mean += static_cast<double>(v);
    mean /= rows;
    INFO("classes=" << classes);
    CHECK(mean == doctest::Approx(want).epsilon(tol<T>() * 10));
    CHECK(max_rel_diff(to_host(dg), g) < tol<T>());
  }
}

TEST_CASE_TEMPLATE("layernorm forward and backward match the host", T, float, double) {
  for (std::int64_t cols : {1, 7, 256, 1031}) {
    const std::int64_t rows = 9;
    const auto x = random_vec<T>(rows * cols, 5, -2, 6), gamma = random_vec<T>(cols, 6, 0.5, 1.5);
    const auto beta = random_vec<T>(cols, 7), dy = random_vec<T>(rows * cols, 8);
    std::vector<T> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dgam(cols, T(0)),
        dbet(cols, T(0));
    host::ref::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                 rstd.data(), rows, cols, 1e-5);
    host::ref::layernorm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(),
                                  dx.data(), dgam.data(), dbet.data(), rows, cols);
    auto dxin = to_device(x), dgm = to_device(gamma), dbt = to_device(beta), ddy = to_device(dy);
    gpu::DeviceBuffer<T> dyo(x.size()), dm(rows), dr(rows), ddx(x.size());
    auto ddg = to_device(std::vector<T>(cols, T(0))), ddb = to_device(std::vector<T>(cols, T(0)));
    gpu::layernorm_forward(dxin.data(), dgm.data(), dbt.data(), dyo.data(), dm.data(), dr.data(),
                           rows, cols, 1e-5);
    gpu::layernorm_backward(dxin.data(), dgm.data(), dm.data(), dr.data(), ddy.data(), ddx.data(),
                            ddg.data(), ddb.data(), rows, cols);
    gpu::synchronize();
    INFO("cols=" << cols);
    CHECK(max_rel_diff(to_host(dyo), y) < tol<T>() * 5);
    CHECK(max_rel_diff(to_host(ddx), dx) < tol<T>() * 50);
    CHECK(max_rel_diff(to_host(ddg), dgam) < tol<T>() * 50);
    CHECK(max_rel_diff(to_host(ddb), dbet) < tol<T>() * 50);
  }
}

TEST_CASE_TEMPLATE("SGD and AdamW updates match the host", T, float, double) {
  const std::size_t n = 100003;
  const auto p0 = random_vec<T>(n, 9), g = random_vec<T>(n, 10), b0 = random_vec<T>(n, 11);
  for (bool nesterov : {false, true}) {
    host::SgdParams h;
    h.lr = 0.1;
    h.momentum = 0.9;
    h.weight_decay = 1e-2;
    h.nesterov = nesterov;
    h.first_step = false;
    auto p = p0, b = b0;
    host::ref::sgd_update(p.data(), g.data(), b.data(), n, h);
    auto dp = to_device(p0), dg = to_device(g), dbuf = to_device(b0);
    gpu::sgd_update(dp.data(), dg.data(), dbuf.data(), n, h);
    gpu::synchronize();
    CHECK(max_rel_diff(to_host(dp), p) < tol<T>());
    CHECK(max_rel_diff(to_host(dbuf), b) < tol<T>());
  }
  const auto m0 = random_vec<T>(n, 12), v0 = random_vec<T>(n, 13, 0, 1);
  host::AdamWParams h;
  h.lr = 1e-2;
  h.step = 4;
  auto p = p0, m = m0, v = v0;
  host::ref::adamw_update(p.data(), g.data(), m.data(), v.data(), n, h);
  auto dp = to_device(p0), dg = to_device(g), dm = to_device(m0), dv = to_device(v0);
  gpu::adamw_update(dp.data(), dg.data(), dm.data(), dv.data(), n, h);
  gpu::synchronize();
  CHECK(max_rel_diff(to_host(dp), p) < tol<T>());
  CHECK(max_rel_diff(to_host(dm), m) < tol<T>());
  CHECK(max_rel_diff(to_host(dv), v) < tol<T>());
}

TEST_CASE("f16 and bf16 conversions are bit-exact with the host") {
  // Every 16-bit pattern widened, and a million random f32 bit patterns narrowed.
  std::vector<dtrain::half> h(65536);
  std::vector<dtrain::bfloat16> b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i] = dtrain::half::from_bits(static_cast<std::uint16_t>(i));
    b[i] = dtrain::bfloat16::from_bits(static_cast<std::uint16_t>(i));
  }
  std::vector<float> hf(65536), bf(65536);
  host::convert(h.data(), hf.data(), h.size());
  host::convert(b.data(), bf.data(), b.size());
  auto dh = to_device(h);
  auto db = to_device(b);
  gpu::DeviceBuffer<float> dhf(65536), dbf(65536);
  gpu::convert(dh.data(), dhf.data(), 65536);
  gpu::convert(db.data(), dbf.data(), 65536);
  gpu::synchronize();
  const auto ghf = to_host(dhf), gbf = to_host(dbf);
  CHECK(std::memcmp(ghf.data(), hf.data(), hf.size() * 4) == 0);
  CHECK(std::memcmp(gbf.data(), bf.data(), bf.size() * 4) == 0);

  const std::size_t n = 1 << 20;
  dtrain::RngStream rng(77, 0);
  std::vector<float> f(n);
  for (auto& x : f) {
    const std::uint32_t u = rng.next_u32();
    std::memcpy(&x, &u, 4);
  }
  std::vector<dtrain::half> fh(n);
  std::vector<dtrain::bfloat16> fb(n);
  host::convert(f.data(), fh.data(), n);
  host::convert(f.data(), fb.data(), n);
  auto df = to_device(f);
  gpu::DeviceBuffer<dtrain::half> dfh(n);
  gpu::DeviceBuffer<dtrain::bfloat16> dfb(n);
  gpu::convert(df.data(), dfh.data(), n);
  gpu::convert(df.data(), dfb.data(), n);
  gpu::synchronize();
  const auto gfh = to_host(dfh);
  const auto gfb = to_host(dfb);
  CHECK(std::memcmp(gfh.data(), fh.data(), n * 2) == 0);
  CHECK(std::memcmp(gfb.data(), fb.data(), n * 2) == 0);
}

TEST_CASE_TEMPLATE("reductions for the all-reduce match the host", T, float, double, std::int32_t,
                   std::int64_t, dtrain::half, dtrain::bfloat16) {
  const std::size_t n = 4099;
  std::vector<T> a(n), b(n);
  dtrain::RngStream rng(3, 3);
  for (std::size_t i = 0; i < n; ++i) {
    const double x = 8.0 * rng.uniform_double() - 4.0, y = 8.0 * rng.uniform_double() - 4.0;
    if constexpr (std::is_integral_v<T>) {
      a[i] = static_cast<T>(x * 100);
      b[i] = static_cast<T>(y * 100);
    } else {
      a[i] = T(static_cast<float>(x));
      b[i] = T(static_cast<float>(y));
    }
  }
  using dtrain::ReduceOp;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    auto want = a;
    host::reduce_into(op, want.data(), b.data(), n);
    if (op == ReduceOp::avg) host::scale_avg(want.data(), n, 3);
    auto da = to_device(a), dbb = to_device(b);
    gpu::reduce_into(op, dtrain::BufferView(da.data(), n, dtrain::dtype_of_v<T>, gpu::space),
                     dtrain::BufferView(dbb.data(), n, dtrain::dtype_of_v<T>, gpu::space));
    if (op == ReduceOp::avg) gpu::scale_avg(da.data(), n, 3);
    gpu::synchronize();
    const auto got = to_host(da);
    INFO(dtrain::name_of(dtrain::dtype_of_v<T>) << " " << dtrain::name_of(op));
    CHECK(std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0);
  }
}

TEST_CASE_TEMPLATE("16-bit all-reduce path: widen, accumulate in f32, round once, as the host", T,
                   dtrain::half, dtrain::bfloat16) {
  const std::size_t n = 4099;
  const int ranks = 5;
  std::vector<std::vector<T>> in(ranks, std::vector<T>(n));
  dtrain::RngStream rng(4, 4);
  for (auto& v : in)
    for (auto& x : v) x = T(static_cast<float>(8.0 * rng.uniform_double() - 4.0));
  using dtrain::ReduceOp;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    std::vector<float> acc(n);
    host::widen(in[0].data(), acc.data(), n);
    for (int r = 1; r < ranks; ++r) host::reduce_into(op, acc.data(), in[r].data(), n);
    if (op == ReduceOp::avg) host::scale_avg(acc.data(), n, ranks);
    std::vector<T> want(n);
    host::narrow(acc.data(), want.data(), n);
    auto d0 = to_device(in[0]);
    gpu::DeviceBuffer<float> dacc(n);
    gpu::widen(d0.data(), dacc.data(), n);
    for (int r = 1; r < ranks; ++r) {
      auto dr = to_device(in[r]);
      gpu::reduce_into(op, dacc.data(), dr.data(), n);
      gpu::synchronize();
    }
    if (op == ReduceOp::avg) gpu::scale_avg(dacc.data(), n, ranks);
    gpu::DeviceBuffer<T> dout(n);
    gpu::narrow(dacc.data(), dout.data(), n);
    gpu::synchronize();
    const auto got = to_host(dout);
    INFO(dtrain::name_of(dtrain::dtype_of_v<T>) << " " << dtrain::name_of(op));
    CHECK(std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0);
    // The same through the untyped forms the hand-over calls (GpuExec::convert, reduce_into with
    // an f32 accumulator and a 16-bit operand).
    auto view = [&](auto& b, dtrain::DType t) {
      return dtrain::BufferView(b.data(), n, t, gpu::space);
    };
    const dtrain::DType t16 = dtrain::dtype_of_v<T>, f32 = dtrain::DType::f32;
    gpu::DeviceBuffer<float> vacc(n);
    gpu::DeviceBuffer<T> vout(n);
    gpu::convert_into(view(vacc, f32), view(d0, t16));
    for (int r = 1; r < ranks; ++r) {
      auto dr = to_device(in[r]);
      gpu::reduce_into(op, view(vacc, f32), view(dr, t16));
      gpu::synchronize();
    }
    if (op == ReduceOp::avg) gpu::scale_avg(vacc.data(), n, ranks);
    gpu::convert_into(view(vout, t16), view(vacc, f32));
    gpu::synchronize();
    const auto got_views = to_host(vout);
    CHECK(std::memcmp(got_views.data(), want.data(), n * sizeof(T)) == 0);
  }
}

int main(int argc, char** argv) {
  if (gpu::device_count() == 0)
    dtrain::test::skip_process((std::string("no ") + gpu::vendor + " device visible").c_str());
  dtrain::test::Watchdog watchdog([](double s) {
    std::fprintf(stderr, "dtrain gpu test watchdog: still running after %.0f s, aborting\n", s);
    std::_Exit(124);
  });
  doctest::Context context(argc, argv);
  return context.run();
}
