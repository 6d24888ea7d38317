// kernels_bench: host GEMM paths against the BLAS library called directly on the same shapes, the
// collectives' host reduction against its former one-element-per-iteration loop, and the forward /
// backward / update split of a 784-1024-1024-10 MLP step. Compiled by nvcc or hipcc
// (kernels_bench_cuda / kernels_bench_hip) it also times the device kernels against the vendor
// BLAS and a device memcpy, after checking each result against the host reference.
//
//   kernels_bench [-n iters] [-w warmup] [-b batch] [--no-mlp] [--no-gemm] [--no-optim]
//                 [--no-reduce] [--same-page-offset]
// --same-page-offset starts the optimizer benchmark's arrays all at one offset within their 4 KiB
// pages (as separately allocated large arrays are), instead of staggering them.
// Every ratio in the output is measured in the same run, interleaved, best of `iters`.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/kernels/host/gemm.hpp>
#include <dtrain/kernels/host/optim.hpp>
#include <dtrain/kernels/host/reduce.hpp>
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
#include <dtrain/kernels/host/blas.hpp>
#include <dtrain/kernels/host/blas_exec.hpp>
#endif
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DTRAIN_BENCH_GPU 1
#include <dtrain/kernels/kernels.cuh>
#endif

namespace {

struct Options {
  int iters = 20;
  int warmup = 3;
  std::int64_t batch = 128;
  bool mlp = true;
  bool gemm = true;
  bool optim = true;
  bool reduce = true;
  bool same_page_offset = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kernels_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-n")
      o.iters = std::atoi(next());
    else if (a == "-w")
      o.warmup = std::atoi(next());
    else if (a == "-b")
      o.batch = std::atoll(next());
    else if (a == "--no-mlp")
      o.mlp = false;
    else if (a == "--no-gemm")
      o.gemm = false;
    else if (a == "--no-optim")
      o.optim = false;
    else if (a == "--no-reduce")
      o.reduce = false;
    else if (a == "--same-page-offset")
      o.same_page_offset = true;
    else {
      std::fprintf(stderr,
                   "usage: kernels_bench [-n iters] [-w warmup] [-b batch] [--no-mlp] [--no-gemm] "
                   "[--no-optim] [--no-reduce] [--same-page-offset]\n");
      std::exit(2);
    }
  }
  if (o.iters < 1) o.iters = 1;
  return o;
}

std::vector<float> random_vec(std::size_t n, std::uint64_t seed) {
  dtrain::RngStream rng(seed, 5);
  std::vector<float> v(n);
  for (auto& x : v) x = 2.0f * rng.uniform() - 1.0f;
  return v;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  return worst;
}

struct GemmShape {
  const char* what;
  std::int64_t m, n, k;
  bool ta, tb;
};

// The MLP's own GEMMs at batch 128 (forward x W^T, weight gradient dy^T x, input gradient dy W)
// plus square sizes.
const GemmShape kShapes[] = {
    {"fwd 784->1024", 128, 1024, 784, false, true},
    {"fwd 1024->1024", 128, 1024, 1024, false, true},
    {"dW 1024x784", 1024, 784, 128, true, false},
    {"dx 1024->1024", 128, 1024, 1024, false, false},
    {"square 256", 256, 256, 256, false, false},
    {"square 1024", 1024, 1024, 1024, false, false},
};

void bench_host_gemm(const Options& o) {
  std::printf(
      "#\n# Host GEMM, f32, row-major; GFLOP/s = 2mnk / time; best of max(%d, 0.25 s worth) "
      "after %d warm-up, paths interleaved\n",
      o.iters, o.warmup);
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
  std::printf("# baseline: cblas_sgemm called directly (OpenBLAS, OPENBLAS_NUM_THREADS=%s)\n",
              std::getenv("OPENBLAS_NUM_THREADS") ? std::getenv("OPENBLAS_NUM_THREADS") : "unset");
  std::printf("# %-16s %5s %5s %5s %2s%2s %10s %10s %10s %8s %8s %10s\n", "shape", "m", "n", "k",
              "tA", "tB", "blas", "dtrain", "blocked", "dtrain/", "blocked/", "max_err");
  std::printf("# %-16s %5s %5s %5s %4s %10s %10s %10s %8s %8s %10s\n", "", "", "", "", "",
              "GFLOP/s", "GFLOP/s", "GFLOP/s", "blas", "blas", "");
#else
  std::printf(
      "# no CBLAS in this build: the host path is the blocked fallback; baseline is the "
      "serial reference\n");
#endif
  for (const auto& s : kShapes) {
    const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const auto a = random_vec(static_cast<std::size_t>((s.ta ? s.k : s.m) * lda), 1);
    const auto b = random_vec(static_cast<std::size_t>((s.tb ? s.n : s.k) * ldb), 2);
    std::vector<float> c_ours(static_cast<std::size_t>(s.m * s.n)), c_blk = c_ours, c_base = c_ours;
    const double flops = 2.0 * s.m * s.n * s.k;
    double t_ours = 1e30, t_blk = 1e30, t_base = 1e30;
    auto run_base = [&](int it) {
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
      (void)it;
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  int(s.m), int(s.n), int(s.k), 1.0f, a.data(), int(lda), b.data(), int(ldb), 0.0f,
                  c_base.data(), int(s.n));
      return true;
#else
      if (it != 0) return false;  // the serial reference is slow: time it once
      dtrain::host::ref::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb,
                                     0.0f, c_base.data(), s.n);
      return true;
#endif
    };
    // "dtrain": the GEMM a layer calls, dtrain::blas::gemm with CBLAS, host::gemm without.
    auto run_ours = [&] {
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
      dtrain::blas::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                                c_ours.data(), s.n);
#else
      dtrain::host::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                                c_ours.data(), s.n);
#endif
    };
    auto run_blocked = [&] {
      dtrain::host::gemm_blocked<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(),
                                        ldb, 0.0f, c_blk.data(), s.n);
    };
    // Best-of-N needs some undisturbed runs on a shared machine: at least `iters`, and enough
    // to spend about a quarter second per path on the fast shapes.
    int iters = o.iters;
    {
      dtrain::Timer t;
      run_ours();
      const double once = t.seconds();
      if (once > 0) iters = std::max(iters, std::min(1000, static_cast<int>(0.25 / once)));
    }
    for (int it = -o.warmup; it < iters; ++it) {
      // Rotate the order each iteration so no path always runs on caches the previous one warmed.
      for (int r = 0; r < 3; ++r) {
        const int which = (r + (it + o.warmup)) % 3;
        dtrain::Timer t;
        bool ran = true;
        if (which == 0)
          ran = run_base(it);
        else if (which == 1)
          run_ours();
        else
          run_blocked();
        const double sec = t.seconds();
        if (it < 0 || !ran) continue;
        double& best = which == 0 ? t_base : which == 1 ? t_ours : t_blk;
        best = std::min(best, sec);
      }
    }
    const double err = std::max(max_rel_diff(c_ours, c_base), max_rel_diff(c_blk, c_base));
    std::printf("  %-16s %5lld %5lld %5lld %2d%2d %10.2f %10.2f %10.2f %8.3f %8.3f %10.2e\n",
                s.what, static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), int(s.ta), int(s.tb), flops / t_base * 1e-9,
                flops / t_ours * 1e-9, flops / t_blk * 1e-9, t_base / t_ours, t_base / t_blk, err);
  }
}

// Host optimizer updates: the one-pass SIMD path as dispatched (AVX when the CPU has it), the
// same path forced to SSE2 (host::detail::host_simd_limit), the scalar loop of the same operations
// (all three bit-identical, checked here) and the long-double reference of the published
// equations. Sizes: example 10's model (784-256-256-10, 269,322 parameters), 784-512-10 (407,050)
// and a 4M-parameter model.
void bench_optim(const Options& o) {
  namespace hd = dtrain::host::detail;
  const hd::HostSimd saved_limit = hd::host_simd_limit();
  hd::host_simd_limit() = hd::HostSimd::avx;
  const bool avx = hd::host_simd_avx();
  std::printf(
      "#\n# Host optimizer updates, f32; best of max(%d, 0.25 s worth) after %d warm-up, paths "
      "interleaved\n# fast = host::adamw_update / sgd_update as dispatched: %s; sse2 = the same "
      "forced to SSE2\n# GB/s counts the bytes the update must move (AdamW 28 B/param, "
      "SGD+momentum 20 B/param)\n# arrays %s\n",
      o.iters, o.warmup, avx ? "AVX lanes" : "SSE2 lanes (this CPU has no AVX)",
      o.same_page_offset ? "all at one offset in their 4 KiB pages (--same-page-offset)"
                         : "staggered by 17 cache lines within their 4 KiB pages");
  std::printf("# %-10s %9s %9s %9s %10s %9s %9s %9s %9s %9s %s\n", "update", "params", "fast ms",
              "sse2 ms", "scalar ms", "ref ms", "fast GB/s", "sse2/fast", "scal/fast", "ref/fast",
              "bits");
  constexpr int kPaths = 4;  // fast, sse2, scalar, ref
  for (const std::size_t n : {std::size_t(269322), std::size_t(407050), std::size_t(4) << 20}) {
    const auto g0 = random_vec(n, 11);
    const auto p0 = random_vec(n, 12), m0 = random_vec(n, 13);
    std::vector<float> v0 = random_vec(n, 14);
    for (auto& x : v0) x = x * x;
    // The g and per-path p, m, v streams in one block, stream k starting 17 cache lines (1088 B)
    // further into its 4 KiB page than stream k-1: separately malloc'ed arrays of this size are
    // page-aligned mmaps, all at the same page offset, and then every path of whichever size ran
    // first measured 3-5x slower (the scalar loop too), the cost of those addresses rather than of
    // the code.
    const std::size_t stride =
        (n + 1023) / 1024 * 1024 + (o.same_page_offset ? 0 : 1088 / sizeof(float));
    std::vector<float> block((1 + 3 * kPaths) * stride + 16);
    float* const base =
        block.data() +
        (16 - reinterpret_cast<std::uintptr_t>(block.data()) % 64 / sizeof(float)) % 16;
    const auto stream = [&](int k) { return base + static_cast<std::size_t>(k) * stride; };
    const float* g = stream(0);
    std::copy(g0.begin(), g0.end(), stream(0));
    float *p[kPaths], *m[kPaths], *v[kPaths];
    for (int k = 0; k < kPaths; ++k) {
      p[k] = stream(1 + 3 * k);
      m[k] = stream(2 + 3 * k);
      v[k] = stream(3 + 3 * k);
    }
    for (int which_update = 0; which_update < 2; ++which_update) {
      const bool adam = which_update == 0;
      // One state per path, each updated in place every run (the state drifts identically, so the
      // bit comparison at the end still holds).
      for (int k = 0; k < kPaths; ++k) {
        std::copy(p0.begin(), p0.end(), p[k]);
        std::copy(m0.begin(), m0.end(), m[k]);
        std::copy(v0.begin(), v0.end(), v[k]);
      }
      dtrain::host::AdamWParams ha;
      ha.lr = 1e-3;
      dtrain::host::SgdParams hs;
      hs.lr = 0.01;
      hs.momentum = 0.9;
      hs.first_step = false;
      hs.weight_decay = 1e-4;
      auto run = [&](int path) {
        float *pp = p[path], *mm = m[path], *vv = v[path];
        hd::host_simd_limit() = path == 1 ? hd::HostSimd::sse2 : hd::HostSimd::avx;
        if (adam) {
          if (path <= 1) dtrain::host::adamw_update(pp, g, mm, vv, n, ha);
          if (path == 2) dtrain::host::adamw_update_scalar(pp, g, mm, vv, n, ha);
          if (path == 3) dtrain::host::ref::adamw_update(pp, g, mm, vv, n, ha);
        } else {
          if (path <= 1) dtrain::host::sgd_update(pp, g, mm, n, hs);
          if (path == 2) dtrain::host::sgd_update_scalar(pp, g, mm, n, hs);
          if (path == 3) dtrain::host::ref::sgd_update(pp, g, mm, n, hs);
        }
      };
      int iters = o.iters;
      {
        dtrain::Timer t;
        run(0);
        const double once = t.seconds();
        if (once > 0) iters = std::max(iters, std::min(2000, static_cast<int>(0.25 / once)));
      }
      // Path 0 ran once more above: give the sse2 and scalar paths the same history before
      // comparing bits.
      run(1);
      run(2);
      double best[kPaths] = {1e30, 1e30, 1e30, 1e30};
      for (int it = -o.warmup; it < iters; ++it)
        for (int r = 0; r < kPaths; ++r) {
          const int path = (r + it + o.warmup) % kPaths;
          if (path == 3 && it > 3) continue;  // the long-double reference is slow: a few runs
          dtrain::Timer t;
          run(path);
          const double sec = t.seconds();
          if (it >= 0 || (path == 3 && it > -o.warmup)) best[path] = std::min(best[path], sec);
        }
      // Equal run counts for paths 0-2 (all ran every iteration), so their states match.
      bool same = true;
      for (int k = 1; k <= 2; ++k)
        same = same && std::memcmp(p[0], p[k], n * 4) == 0 && std::memcmp(m[0], m[k], n * 4) == 0 &&
               (!adam || std::memcmp(v[0], v[k], n * 4) == 0);
      const double bytes = (adam ? 28.0 : 20.0) * static_cast<double>(n);
      std::printf("  %-10s %9zu %9.3f %9.3f %10.3f %9.3f %9.2f %9.2f %9.2f %9.1f %s\n",
                  adam ? "adamw" : "sgd+mom", n, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3,
                  best[3] * 1e3, bytes / best[0] * 1e-9, best[1] / best[0], best[2] / best[0],
                  best[3] / best[0], same ? "identical" : "DIFFER");
    }
  }
  hd::host_simd_limit() = saved_limit;
}

// The collectives' host reduction (host::reduce, the operation known only at run time, as in
// every collective) against the loop it replaced, which tested the operation for every element
// (combine() called with the run-time operation; GCC 12 compiled that to one scalar element per
// iteration), and against memcpy of the output's bytes. f32 sum; the results of the two loops are
// compared bit for bit. In place: a = a + b (as shm and gradient sync reduce); out of place:
// out = a + b.
void bench_reduce(const Options& o) {
  using dtrain::ReduceOp;
  volatile int op_index = 0;  // the operation as the collectives see it: a run-time value
  const ReduceOp op = op_index == 0 ? ReduceOp::sum : ReduceOp::max;
  const auto former = [op](float* out, const float* a, const float* b, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = dtrain::host::detail::combine<float>(op, a[i], b[i]);
  };
  std::printf(
      "#\n# Host reduction, f32 sum, operation known at run time; best of %d after %d warm-up, "
      "paths interleaved\n# times in us; former = one element per iteration, operation "
      "tested per element\n",
      o.iters, o.warmup);
  std::printf("# %9s %11s %11s %11s %11s %11s %13s %13s %s\n", "bytes", "inplace us", "former us",
              "outplace us", "former us", "memcpy us", "former/new in", "former/new out", "bits");
  for (const std::size_t bytes :
       {std::size_t(64) << 10, std::size_t(256) << 10, std::size_t(1) << 20, std::size_t(4) << 20,
        std::size_t(16) << 20}) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> a = random_vec(n, 21), b = random_vec(n, 22), out(n), out_former(n);
    dtrain::host::reduce(op, dtrain::DType::f32, out.data(), a.data(), b.data(), n);
    former(out_former.data(), a.data(), b.data(), n);
    const bool same = std::memcmp(out.data(), out_former.data(), bytes) == 0;
    std::vector<float> acc = a;
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    for (int it = -o.warmup; it < o.iters; ++it) {
      double t[5];
      double t0 = dtrain::now_seconds();
      dtrain::host::reduce(op, dtrain::DType::f32, acc.data(), acc.data(), b.data(), n);
      t[0] = dtrain::now_seconds() - t0;
      t0 = dtrain::now_seconds();
      former(acc.data(), acc.data(), b.data(), n);
      t[1] = dtrain::now_seconds() - t0;
      t0 = dtrain::now_seconds();
      dtrain::host::reduce(op, dtrain::DType::f32, out.data(), a.data(), b.data(), n);
      t[2] = dtrain::now_seconds() - t0;
      t0 = dtrain::now_seconds();
      former(out_former.data(), a.data(), b.data(), n);
      t[3] = dtrain::now_seconds() - t0;
      t0 = dtrain::now_seconds();
      std::memcpy(out.data(), a.data(), bytes);
      t[4] = dtrain::now_seconds() - t0;
      if (it >= 0)
        for (int k = 0; k < 5; ++k) best[k] = std::min(best[k], t[k]);
    }
    std::printf("  %9zu %11.1f %11.1f %11.1f %11.1f %11.1f %13.2f %13.2f %s\n", bytes,
                best[0] * 1e6, best[1] * 1e6, best[2] * 1e6, best[3] * 1e6, best[4] * 1e6,
                best[1] / best[0], best[3] / best[2], same ? "identical" : "DIFFER");
  }
}

void bench_mlp(const Options& o) {
  const std::int64_t batch = o.batch;
  // The layers' GEMM is the policy's: CBLAS through HostBlasExec when this build has it.
  const std::vector<dtrain::LayerSpec> layers = {dtrain::Linear(784, 1024), dtrain::Relu(),
                                                 dtrain::Linear(1024, 1024), dtrain::Relu(),
                                                 dtrain::Linear(1024, 10)};
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
  using Exec = dtrain::HostBlasExec;
#else
  using Exec = dtrain::HostExec;
#endif
  Exec exec;
  dtrain::BasicSequential<float, Exec> model(layers, exec);
  model.init(1);
  dtrain::BasicAdamW<Exec> opt(model, 1e-3);
  const auto x = random_vec(static_cast<std::size_t>(batch * 784), 3);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::int64_t i = 0; i < batch; ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  std::vector<float> dlogits(static_cast<std::size_t>(batch * 10));
  std::vector<double> t_fwd, t_bwd, t_upd;
  for (int it = -o.warmup; it < o.iters; ++it) {
    model.zero_grad();
    dtrain::Timer t;
    const float* out = model.forward(x.data(), batch);
    const double f = t.seconds();
    t.reset();
    dtrain::host::softmax_cross_entropy(out, labels.data(), batch, 10, dlogits.data());
    model.backward(dlogits.data());
    const double b = t.seconds();
    t.reset();
    opt.step();
    const double u = t.seconds();
    if (it >= 0) {
      t_fwd.push_back(f);
      t_bwd.push_back(b);
      t_upd.push_back(u);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const double f = median(t_fwd), b = median(t_bwd), u = median(t_upd), total = f + b + u;
  const double fb = best(t_fwd), bb = best(t_bwd), ub = best(t_upd);
  // GEMM flops: forward x W^T per layer; backward dW per layer plus dx for all but the first.
  const double flops = 2.0 * batch * (784.0 * 1024 + 1024.0 * 1024 + 1024.0 * 10);
  const double bflops = flops + 2.0 * batch * (1024.0 * 1024 + 1024.0 * 10);
  std::printf(
      "#\n# MLP 784-1024-1024-10 (ReLU, softmax cross-entropy, AdamW), batch %lld, f32, "
      "%zu parameters, %d steps\n",
      static_cast<long long>(batch), model.parameter_count(), o.iters);
  std::printf("# %-10s %10s %10s %8s %10s   (GEMM GFLOP/s at the median)\n", "phase", "median(ms)",
              "best(ms)", "share", "GFLOP/s");
  std::printf("  %-10s %10.3f %10.3f %7.1f%% %10.2f\n", "forward", f * 1e3, fb * 1e3,
              100 * f / total, flops / f * 1e-9);
  std::printf("  %-10s %10.3f %10.3f %7.1f%% %10.2f\n", "backward", b * 1e3, bb * 1e3,
              100 * b / total, bflops / b * 1e-9);
  std::printf("  %-10s %10.3f %10.3f %7.1f%% %10s\n", "update", u * 1e3, ub * 1e3, 100 * u / total,
              "-");
  std::printf("  %-10s %10.3f %10.3f %7.1f%% %10.2f   samples/s %.0f (median)\n", "step",
              total * 1e3, (fb + bb + ub) * 1e3, 100.0, (flops + bflops) / total * 1e-9,
              batch / total);
}

#if defined(DTRAIN_BENCH_GPU)
namespace gpu = dtrain::gpu;

void bench_device(const Options& o) {
  if (gpu::device_count() == 0) {
    std::printf("#\n# device section skipped: no %s device visible\n", gpu::vendor);
    return;
  }
#if defined(DTRAIN_GPU_VENDOR_BLAS)
  const char* vendor_blas = "on";
#else
  const char* vendor_blas = "off";
#endif
  std::printf("#\n# Device: %s (%s, warp %d); vendor BLAS %s; best of %d after %d warm-up\n",
              gpu::device_name().c_str(), gpu::vendor, gpu::device_warp_size(), vendor_blas,
              o.iters, o.warmup);
  gpu::event_t e0 = gpu::event_create(), e1 = gpu::event_create();
  auto time_ms = [&](auto&& fn) {
    float best = 1e30f;
    for (int it = -o.warmup; it < o.iters; ++it) {
      gpu::event_record(e0);
      fn();
      gpu::event_record(e1);
      const float ms = gpu::event_elapsed_ms(e0, e1);
      if (it >= 0) best = std::min(best, ms);
    }
    return best;
  };
  std::printf("# %-16s %5s %5s %5s %12s %12s %8s %10s\n", "gemm f32", "m", "n", "k", "tiled GF/s",
              "vendor GF/s", "ratio", "max_err");
  for (const auto& s : kShapes) {
    const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const auto a = random_vec(static_cast<std::size_t>((s.ta ? s.k : s.m) * lda), 1);
    const auto b = random_vec(static_cast<std::size_t>((s.tb ? s.n : s.k) * ldb), 2);
    std::vector<float> want(static_cast<std::size_t>(s.m * s.n)), got(want.size());
    dtrain::host::ref::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb,
                                   0.0f, want.data(), s.n);
    gpu::DeviceBuffer<float> da(a.size()), db(b.size()), dc(want.size());
    da.upload(a.data());
    db.upload(b.data());
    gpu::gemm_tiled<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, da.data(), lda, db.data(), ldb, 0.0f,
                           dc.data(), s.n);
    gpu::synchronize();
    dc.download(got.data());
    const double err = max_rel_diff(got, want);
    const double flops = 2.0 * s.m * s.n * s.k;
    const float tt = time_ms([&] {
      gpu::gemm_tiled<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, da.data(), lda, db.data(), ldb, 0.0f,
                             dc.data(), s.n);
    });
    float tv = 0;
#if defined(DTRAIN_GPU_VENDOR_BLAS)
    tv = time_ms([&] {
      gpu::vendor_gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, da.data(), lda, db.data(), ldb, 0.0f,
                              dc.data(), s.n);
    });
#endif
    std::printf("  %-16s %5lld %5lld %5lld %12.1f %12.1f %8.3f %10.2e\n", s.what,
                static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), flops / tt * 1e-6, tv > 0 ? flops / tv * 1e-6 : 0.0,
                tv > 0 ? tv / tt : 0.0, err);
  }
  // AdamW touches 4 arrays read + 3 written: its floor is 28 B/element at memcpy bandwidth.
  const std::size_t n = std::size_t(1) << 24;
  gpu::DeviceBuffer<float> p(n), g(n), m(n), v(n), src(n), dst(n);
  const auto init = random_vec(n, 9);
  for (auto* buf : {&p, &g, &m, &src}) buf->upload(init.data());
  gpu::memset_async(v.data(), 0, n * 4);
  dtrain::host::AdamWParams h;
  const float t_copy =
      time_ms([&] { gpu::memcpy(dst.data(), src.data(), n * 4, gpu::CopyKind::device_to_device); });
  const float t_adam =
      time_ms([&] { gpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, h); });
  const double copy_bw = 2.0 * n * 4 / (t_copy * 1e-3) * 1e-9;
  const double adam_bw = 7.0 * n * 4 / (t_adam * 1e-3) * 1e-9;
  std::printf("# %-16s %12s %12s %8s\n", "bandwidth", "GB/s", "memcpy GB/s", "ratio");
  std::printf("  %-16s %12.1f %12.1f %8.3f\n", "adamw 16M f32", adam_bw, copy_bw,
              adam_bw / copy_bw);
  // Other streaming kernels against the same memcpy: f32 -> f16 (6 B/element), dropout forward
  // (8 B/element), unfused bias add then ReLU in place (16 B/element over the two kernels).
  gpu::DeviceBuffer<dtrain::half> half_out(n);
  const float t_conv = time_ms([&] { gpu::convert(src.data(), half_out.data(), n); });
  const float t_drop = time_ms([&] {
    gpu::dropout_forward(src.data(), dst.data(), std::int64_t(n) / 1024, 1024, 0.1f, 1, 2, 0);
  });
  const float t_bias = time_ms([&] {
    gpu::bias_add(dst.data(), src.data(), std::int64_t(n) / 1024, 1024);
    gpu::activation_forward(dtrain::host::Activation::relu, dst.data(), dst.data(), n);
  });
  const struct {
    const char* what;
    double bytes;
    float ms;
  } rows[] = {{"f32->f16 16M", 6.0 * n, t_conv},
              {"dropout 16M f32", 8.0 * n, t_drop},
              {"bias+relu 16M", 16.0 * n, t_bias}};
  for (const auto& r : rows) {
    const double bw = r.bytes / (r.ms * 1e-3) * 1e-9;
    std::printf("  %-16s %12.1f %12.1f %8.3f\n", r.what, bw, copy_bw, bw / copy_bw);
  }
  gpu::event_destroy(e0);
  gpu::event_destroy(e1);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
  std::printf("# dtrain kernels_bench: host BLAS CBLAS\n");
#else
  std::printf("# dtrain kernels_bench: host BLAS none\n");
#endif
  if (o.gemm) bench_host_gemm(o);
  if (o.optim) bench_optim(o);
  if (o.reduce) bench_reduce(o);
  if (o.mlp) bench_mlp(o);
#if defined(DTRAIN_BENCH_GPU)
  bench_device(o);
#endif
  return 0;
}
