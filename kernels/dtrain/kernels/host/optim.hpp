// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host optimizer update kernels (SGD with momentum/Nesterov, AdamW): one-pass fast paths,
// the scalar order they reproduce bit for bit, and long-double references of the published
// update equations.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
// The AVX lanes are compiled for every x86-64 GCC/Clang host pass and chosen at run time; the
// condition is a property of the target, the same in every translation unit of one program
// (device passes never emit these host functions).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
#include <immintrin.h>
#define DTRAIN_HOST_OPTIM_X86_AVX 1
#endif

// No floating-point contraction in this header's functions, whatever the including translation
// unit's flags: with FMA in the target (-march=native, -mfma), GCC's default -ffp-contract=fast
// fuses a multiply and an add into one rounding, in the scalar loops and in the SIMD lanes alike
// (intrinsics are plain vector arithmetic to it), and the paths stop giving the scalar order's
// bits; clang's default contracts within one expression (the scalar loops). Measured with
// -march=native on an FMA machine: every bit-for-bit check of unit_kernels_host failed before.
// Closed at the end of the header. Not under nvcc, whose front end drops these pragmas before its
// host compiler sees them (and warns); see DTRAIN_HOST_NO_CONTRACT below for that case. Device
// passes never emit these functions.
#if !defined(__NVCC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define DTRAIN_HOST_OPTIM_NO_CONTRACT 1
#if defined(__clang__)
#pragma float_control(push)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#endif

// Under nvcc with GCC as the host compiler, each function of this header that computes carries
// the same option as a function attribute, which nvcc's front end passes on (the pragmas above
// it drops): built by nvcc with -Xcompiler -march=native, 6 of the 24 cases of the bit-for-bit
// tests failed without it (unit_kernels_host_nvcc_native). Empty elsewhere, and with clang as
// nvcc's host compiler, which ignores the attribute. Left defined, so that a caller's own
// written-out reference of these updates can be compiled the same way.
#if defined(__NVCC__) && !defined(__CUDA_ARCH__) && defined(__GNUC__) && !defined(__clang__)
#define DTRAIN_HOST_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define DTRAIN_HOST_NO_CONTRACT
#endif

namespace dtrain {
namespace host {

/// Hyper-parameters of one SGD update (PyTorch semantics: L2 weight decay added to the gradient,
/// the momentum buffer is set to the gradient on the first step).
struct SgdParams {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;
};

/// Hyper-parameters of one AdamW update (Loshchilov and Hutter: weight decay decoupled from the
/// adaptive step; step >= 1 is the 1-based count used for bias correction).
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  long long step = 1;
};

namespace detail {
/// The per-step constants of an AdamW update in the element type, computed once per call in
/// double from the hyper-parameters. Host and device updates use the same values.
template <class T>
struct AdamWCoeffs {
  T b1, b2, c1, c2, decay, step_size, inv_bc2, eps;
};
template <class T>
DTRAIN_HOST_NO_CONTRACT AdamWCoeffs<T> adamw_coeffs(const AdamWParams& h) {
  const double t = static_cast<double>(h.step);
  AdamWCoeffs<T> k;
  k.b1 = static_cast<T>(h.beta1);
  k.b2 = static_cast<T>(h.beta2);
  k.c1 = static_cast<T>(1.0 - h.beta1);
  k.c2 = static_cast<T>(1.0 - h.beta2);
  k.decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
  // lr / (1 - beta1^t) folded into one factor; 1 / (1 - beta2^t) applied to v inside the sqrt.
  k.step_size = static_cast<T>(h.lr / (1.0 - std::pow(h.beta1, t)));
  k.inv_bc2 = static_cast<T>(1.0 / (1.0 - std::pow(h.beta2, t)));
  k.eps = static_cast<T>(h.eps);
  return k;
}

// One AdamW element in T arithmetic, in the operation order every host path reproduces:
// m' = b1 m + c1 g; v' = b2 v + (c2 g) g; p' = p decay - (step_size m') / (sqrt(v' inv_bc2) + eps).
template <class T>
DTRAIN_HOST_NO_CONTRACT inline void adamw_element(T& p, T g, T& m, T& v,
                                                  const AdamWCoeffs<T>& k) noexcept {
  const T mi = k.b1 * m + k.c1 * g;
  const T vi = k.b2 * v + k.c2 * g * g;
  m = mi;
  v = vi;
  p = p * k.decay - k.step_size * mi / (std::sqrt(vi * k.inv_bc2) + k.eps);
}

// The lane loops of adamw_element and sgd_element (below), written once for every instruction
// set: DTRAIN_HOST_OPTIM_LANE_LOOPS(Lanes, suffix, specifiers) defines adamw_lanes##suffix and
// sgd_lanes##suffix over the lane type Lanes<T> (Sse2 or Avx: set1, load, store, add, sub, mul,
// div, sqrt and `width`), each function carrying `specifiers`. A macro rather than a function
// template over the lane type, because a function compiled for AVX cannot share a body with the
// baseline one: the AVX lanes need target("avx") on the function that holds their values (clang
// refuses AVX vector values in a function without it, even in an always-inline body), and a
// template cannot take its target from its arguments. Both expansions are the same operations in
// the same order as the scalar elements, one rounding per operation, so every path gives the
// scalar loop's bits. Each returns how many leading elements it updated (whole lanes).
//
// AdamW: m' = b1 m + c1 g; v' = b2 v + (c2 g) g; p' = p decay - (step_size m') / (sqrt(v' inv_bc2)
// + eps). SGD: d = g + wd p; b = First ? d : mu b + damp d; p - lr (Nesterov ? d + mu b : b).
// Whole lanes only: `end` is n rounded down to a lane multiple, so i never passes n. (With the
// bound written as i + width <= n, GCC could not prove that and warned about the tail loop,
// -Waggressive-loop-optimizations.)
#define DTRAIN_HOST_OPTIM_LANE_LOOPS(Lanes, suffix, specifiers)                                  \
  template <class T>                                                                             \
  DTRAIN_HOST_NO_CONTRACT specifiers std::size_t adamw_lanes##suffix(                            \
      T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, std::size_t n,   \
      const AdamWCoeffs<T>& k) noexcept {                                                        \
    using S = Lanes<T>;                                                                          \
    const auto b1 = S::set1(k.b1), b2 = S::set1(k.b2), c1 = S::set1(k.c1), c2 = S::set1(k.c2),   \
               decay = S::set1(k.decay), step = S::set1(k.step_size), ibc2 = S::set1(k.inv_bc2), \
               eps = S::set1(k.eps);                                                             \
    const std::size_t end = n - n % S::width;                                                    \
    std::size_t i = 0;                                                                           \
    for (; i < end; i += S::width) {                                                             \
      const auto gi = S::load(g + i);                                                            \
      const auto mi = S::add(S::mul(b1, S::load(m + i)), S::mul(c1, gi));                        \
      const auto vi = S::add(S::mul(b2, S::load(v + i)), S::mul(S::mul(c2, gi), gi));            \
      S::store(m + i, mi);                                                                       \
      S::store(v + i, vi);                                                                       \
      const auto den = S::add(S::sqrt(S::mul(vi, ibc2)), eps);                                   \
      S::store(p + i, S::sub(S::mul(S::load(p + i), decay), S::div(S::mul(step, mi), den)));     \
    }                                                                                            \
    return i;                                                                                    \
  }                                                                                              \
  template <bool Momentum, bool First, bool Nesterov, class T>                                   \
  DTRAIN_HOST_NO_CONTRACT specifiers std::size_t sgd_lanes##suffix(                              \
      T* __restrict p, const T* __restrict g, T* __restrict b, std::size_t n, T lr, T wd, T mu,  \
      T damp) noexcept {                                                                         \
    using S = Lanes<T>;                                                                          \
    const auto lrv = S::set1(lr), wdv = S::set1(wd), muv = S::set1(mu), dampv = S::set1(damp);   \
    const std::size_t end = n - n % S::width;                                                    \
    std::size_t i = 0;                                                                           \
    for (; i < end; i += S::width) {                                                             \
      const auto pi = S::load(p + i);                                                            \
      const auto d = S::add(S::load(g + i), S::mul(wdv, pi));                                    \
      if constexpr (!Momentum) {                                                                 \
        S::store(p + i, S::sub(pi, S::mul(lrv, d)));                                             \
      } else {                                                                                   \
        const auto bi = First ? d : S::add(S::mul(muv, S::load(b + i)), S::mul(dampv, d));       \
        S::store(b + i, bi);                                                                     \
        S::store(p + i, S::sub(pi, S::mul(lrv, Nesterov ? S::add(d, S::mul(muv, bi)) : bi)));    \
      }                                                                                          \
    }                                                                                            \
    return i;                                                                                    \
  }

#if defined(__SSE2__)
// SSE2 lanes of adamw_element and sgd_element: the same operations in the same order, each
// correctly rounded per lane (sqrtps/sqrtpd are IEEE square roots), so the bits equal the scalar
// loop's. Written with intrinsics because a std::sqrt loop does not vectorise under the default
// -fmath-errno, and so that the lanes do not depend on the optimisation level: GCC vectorised the
// plain SGD loop at -O3 only, and at -O2 (nvcc's host default, CMake's RelWithDebInfo) SGD ran
// 2-4x slower. __SSE2__ is part of the x86-64 ABI, so every translation unit of one program sees
// the same choice (it is a property of the target, not a feature switch).
template <class T>
struct Sse2;
template <>
struct Sse2<float> {
  using V = __m128;
  static constexpr std::size_t width = 4;
  DTRAIN_HOST_NO_CONTRACT static V set1(float x) noexcept { return _mm_set1_ps(x); }
  DTRAIN_HOST_NO_CONTRACT static V load(const float* p) noexcept { return _mm_loadu_ps(p); }
  DTRAIN_HOST_NO_CONTRACT static void store(float* p, V x) noexcept { _mm_storeu_ps(p, x); }
  DTRAIN_HOST_NO_CONTRACT static V add(V a, V b) noexcept { return _mm_add_ps(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V sub(V a, V b) noexcept { return _mm_sub_ps(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V mul(V a, V b) noexcept { return _mm_mul_ps(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V div(V a, V b) noexcept { return _mm_div_ps(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V sqrt(V a) noexcept { return _mm_sqrt_ps(a); }
};
template <>
struct Sse2<double> {
  using V = __m128d;
  static constexpr std::size_t width = 2;
  DTRAIN_HOST_NO_CONTRACT static V set1(double x) noexcept { return _mm_set1_pd(x); }
  DTRAIN_HOST_NO_CONTRACT static V load(const double* p) noexcept { return _mm_loadu_pd(p); }
  DTRAIN_HOST_NO_CONTRACT static void store(double* p, V x) noexcept { _mm_storeu_pd(p, x); }
  DTRAIN_HOST_NO_CONTRACT static V add(V a, V b) noexcept { return _mm_add_pd(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V sub(V a, V b) noexcept { return _mm_sub_pd(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V mul(V a, V b) noexcept { return _mm_mul_pd(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V div(V a, V b) noexcept { return _mm_div_pd(a, b); }
  DTRAIN_HOST_NO_CONTRACT static V sqrt(V a) noexcept { return _mm_sqrt_pd(a); }
};
DTRAIN_HOST_OPTIM_LANE_LOOPS(Sse2, , inline)
#else
// Other targets: the scalar loops below do all elements.
template <class T>
inline std::size_t adamw_lanes(T*, const T*, T*, T*, std::size_t, const AdamWCoeffs<T>&) noexcept {
  return 0;
}
template <bool Momentum, bool First, bool Nesterov, class T>
inline std::size_t sgd_lanes(T*, const T*, T*, std::size_t, T, T, T, T) noexcept {
  return 0;
}
#endif

/// The widest host SIMD instruction set the optimizer updates may use.
enum class HostSimd { sse2, avx };

/// Test knob: the optimizer updates use at most this instruction set (`sse2` forces the baseline
/// lanes so tests and kernels_bench can compare both paths in one process). Default `avx`: AVX
/// where the CPU and OS support it. Not synchronised: set it before updates run on other threads.
inline HostSimd& host_simd_limit() noexcept {
  static HostSimd limit = HostSimd::avx;
  return limit;
}

#if defined(DTRAIN_HOST_OPTIM_X86_AVX)
/// Whether this CPU and its OS support AVX (the OS saves the ymm registers), asked once. Local,
/// thread-safe.
inline bool cpu_has_avx() noexcept {
  static const bool yes = __builtin_cpu_supports("avx") != 0;
  return yes;
}

// AVX lanes of adamw_element and sgd_element (8 floats or 4 doubles), chosen at run time. "avx"
// only, never "fma" or "avx2": with FMA enabled, GCC contracts the separate multiply and add (its
// intrinsics are plain vector arithmetic, -ffp-contract=fast) and the bits would leave the scalar
// order. The loops are the SSE2 ones (DTRAIN_HOST_OPTIM_LANE_LOOPS) over 256-bit lanes.
template <class T>
struct Avx;
template <>
struct Avx<float> {
  using V = __m256;
  static constexpr std::size_t width = 8;
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V set1(float x) noexcept {
    return _mm256_set1_ps(x);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V load(const float* p) noexcept {
    return _mm256_loadu_ps(p);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static void store(float* p, V x) noexcept {
    _mm256_storeu_ps(p, x);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V add(V a, V b) noexcept {
    return _mm256_add_ps(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V sub(V a, V b) noexcept {
    return _mm256_sub_ps(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V mul(V a, V b) noexcept {
    return _mm256_mul_ps(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V div(V a, V b) noexcept {
    return _mm256_div_ps(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V sqrt(V a) noexcept {
    return _mm256_sqrt_ps(a);
  }
};
template <>
struct Avx<double> {
  using V = __m256d;
  static constexpr std::size_t width = 4;
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V set1(double x) noexcept {
    return _mm256_set1_pd(x);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V load(const double* p) noexcept {
    return _mm256_loadu_pd(p);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static void store(double* p,
                                                                           V x) noexcept {
    _mm256_storeu_pd(p, x);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V add(V a, V b) noexcept {
    return _mm256_add_pd(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V sub(V a, V b) noexcept {
    return _mm256_sub_pd(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V mul(V a, V b) noexcept {
    return _mm256_mul_pd(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V div(V a, V b) noexcept {
    return _mm256_div_pd(a, b);
  }
  DTRAIN_HOST_NO_CONTRACT __attribute__((target("avx"))) static V sqrt(V a) noexcept {
    return _mm256_sqrt_pd(a);
  }
};
DTRAIN_HOST_OPTIM_LANE_LOOPS(Avx, _avx, __attribute__((target("avx"))))
#else
inline bool cpu_has_avx() noexcept { return false; }
template <class T>
std::size_t adamw_lanes_avx(T*, const T*, T*, T*, std::size_t, const AdamWCoeffs<T>&) noexcept {
  return 0;
}
template <bool Momentum, bool First, bool Nesterov, class T>
std::size_t sgd_lanes_avx(T*, const T*, T*, std::size_t, T, T, T, T) noexcept {
  return 0;
}
#endif

/// Whether the optimizer updates take their AVX lanes now: the CPU has AVX and host_simd_limit()
/// allows it. Local; thread-safe while the knob is not being set.
inline bool host_simd_avx() noexcept { return host_simd_limit() >= HostSimd::avx && cpu_has_avx(); }
}  // namespace detail

namespace ref {
/// Serial reference SGD step in long double. buf may be null when momentum == 0.
template <class T>
DTRAIN_HOST_NO_CONTRACT void sgd_update(T* p, const T* g, T* buf, std::size_t n,
                                        const SgdParams& h) {
  for (std::size_t i = 0; i < n; ++i) {
    long double d =
        static_cast<long double>(g[i]) + h.weight_decay * static_cast<long double>(p[i]);
    if (h.momentum != 0.0) {
      long double b =
          h.first_step ? d
                       : h.momentum * static_cast<long double>(buf[i]) + (1.0L - h.dampening) * d;
      buf[i] = static_cast<T>(b);
      b = static_cast<T>(b);
      d = h.nesterov ? d + h.momentum * b : b;
    }
    p[i] = static_cast<T>(p[i] - h.lr * d);
  }
}
/// Serial reference AdamW step in long double, written as the published update equations.
template <class T>
DTRAIN_HOST_NO_CONTRACT void adamw_update(T* p, const T* g, T* m, T* v, std::size_t n,
                                          const AdamWParams& h) {
  const long double t = static_cast<long double>(h.step);
  for (std::size_t i = 0; i < n; ++i) {
    long double theta = p[i];
    theta -= h.lr * h.weight_decay * theta;
    const long double mi = h.beta1 * static_cast<long double>(m[i]) + (1 - h.beta1) * g[i];
    const long double vi = h.beta2 * static_cast<long double>(v[i]) +
                           (1 - h.beta2) * static_cast<long double>(g[i]) * g[i];
    const long double mhat = mi / (1 - std::pow(static_cast<long double>(h.beta1), t));
    const long double vhat = vi / (1 - std::pow(static_cast<long double>(h.beta2), t));
    theta -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(theta);
  }
}
}  // namespace ref

namespace detail {
// One SGD element in T arithmetic (d = g + wd p; b = first ? d : mu b + damp d;
// p -= lr (nesterov ? d + mu b : b)), the order every host path reproduces. The switches are
// template arguments, so each combination compiles to a branch-free loop (no square root, no
// reassociation: the SIMD lanes above round exactly as this scalar code).
template <class T>
DTRAIN_HOST_NO_CONTRACT inline void sgd_element(T& p, T g, T lr, T wd) noexcept {
  p -= lr * (g + wd * p);
}
template <bool First, bool Nesterov, class T>
DTRAIN_HOST_NO_CONTRACT inline void sgd_element(T& p, T g, T& b, T lr, T wd, T mu,
                                                T damp) noexcept {
  const T d = g + wd * p;
  const T bi = First ? d : mu * b + damp * d;
  b = bi;
  p -= lr * (Nesterov ? d + mu * bi : bi);
}
template <bool Momentum, bool First, bool Nesterov, bool Restrict, class T>
DTRAIN_HOST_NO_CONTRACT inline void sgd_loop(T* p, const T* g, T* buf, std::size_t n, T lr, T wd,
                                             T mu, T damp) noexcept {
  using P = std::conditional_t<Restrict, T* __restrict, T*>;
  using G = std::conditional_t<Restrict, const T* __restrict, const T*>;
  const P pr = p;
  const G gr = g;
  const P br = buf;
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (Momentum)
      sgd_element<First, Nesterov>(pr[i], gr[i], br[i], lr, wd, mu, damp);
    else
      sgd_element(pr[i], gr[i], lr, wd);
  }
}
// How an SGD update runs: element by element (the reference), or SIMD lanes (SSE2 or AVX) with
// the scalar loop for the last partial lane.
enum class SgdPath { scalar, sse2, avx };
// The switches turned into template arguments.
template <SgdPath Path, class T>
DTRAIN_HOST_NO_CONTRACT void sgd_dispatch(T* p, const T* g, T* buf, std::size_t n,
                                          const SgdParams& h) noexcept {
  const T lr = static_cast<T>(h.lr), wd = static_cast<T>(h.weight_decay);
  const T mu = static_cast<T>(h.momentum), damp = static_cast<T>(1.0 - h.dampening);
  const auto loop = [&](auto momentum, auto first, auto nesterov) {
    constexpr bool M = decltype(momentum)::value, F = decltype(first)::value,
                   N = decltype(nesterov)::value;
    std::size_t i = 0;
    if constexpr (Path == SgdPath::avx)
      i = sgd_lanes_avx<M, F, N>(p, g, buf, n, lr, wd, mu, damp);
    else if constexpr (Path == SgdPath::sse2)
      i = sgd_lanes<M, F, N>(p, g, buf, n, lr, wd, mu, damp);
    sgd_loop<M, F, N, Path != SgdPath::scalar>(p + i, g + i, M ? buf + i : nullptr, n - i, lr, wd,
                                               mu, damp);
  };
  using Y = std::true_type;
  using No = std::false_type;
  if (h.momentum == 0.0) return loop(No{}, No{}, No{});
  if (h.first_step) return h.nesterov ? loop(Y{}, Y{}, Y{}) : loop(Y{}, Y{}, No{});
  return h.nesterov ? loop(Y{}, No{}, Y{}) : loop(Y{}, No{}, No{});
}
}  // namespace detail

/// SGD step element by element (the loop may alias, so it is not vectorised): the operation order
/// sgd_update reproduces bit for bit, and kernels_bench's baseline. buf may be null when
/// momentum == 0. Local.
template <class T>
DTRAIN_HOST_NO_CONTRACT void sgd_update_scalar(T* p, const T* g, T* buf, std::size_t n,
                                               const SgdParams& h) {
  detail::sgd_dispatch<detail::SgdPath::scalar>(p, g, buf, n, h);
}

/// SGD step over n elements in one pass, no temporaries, vectorised (on x86-64 with AVX lanes
/// when the CPU has them, chosen at run time, else SSE2); the same bits as sgd_update_scalar.
/// buf (the momentum buffer) may be null when momentum == 0. Local, blocking; p, g, buf must not
/// overlap.
template <class T>
DTRAIN_HOST_NO_CONTRACT void sgd_update(T* p, const T* g, T* buf, std::size_t n,
                                        const SgdParams& h) {
  if (detail::host_simd_avx())
    detail::sgd_dispatch<detail::SgdPath::avx>(p, g, buf, n, h);
  else
    detail::sgd_dispatch<detail::SgdPath::sse2>(p, g, buf, n, h);
}

/// AdamW step element by element in T arithmetic: the operation order the fast path reproduces
/// bit for bit, and the baseline kernels_bench times it against. Local; buffers must not overlap.
template <class T>
DTRAIN_HOST_NO_CONTRACT void adamw_update_scalar(T* p, const T* g, T* m, T* v, std::size_t n,
                                                 const AdamWParams& h) {
  const auto k = detail::adamw_coeffs<T>(h);
  for (std::size_t i = 0; i < n; ++i) detail::adamw_element(p[i], g[i], m[i], v[i], k);
}

/// AdamW step over n elements; m and v are the first and second moments. One pass over the four
/// arrays, no temporaries, SIMD lanes where the target has them (on x86-64: AVX when the CPU has
/// it, chosen at run time, else SSE2), and the same bits as adamw_update_scalar for every n and
/// every path. Local, blocking; the buffers must not overlap.
template <class T>
DTRAIN_HOST_NO_CONTRACT void adamw_update(T* __restrict p, const T* __restrict g, T* __restrict m,
                                          T* __restrict v, std::size_t n, const AdamWParams& h) {
  const auto k = detail::adamw_coeffs<T>(h);
  std::size_t i = detail::host_simd_avx() ? detail::adamw_lanes_avx(p, g, m, v, n, k)
                                          : detail::adamw_lanes(p, g, m, v, n, k);
  for (; i < n; ++i) detail::adamw_element(p[i], g[i], m[i], v[i], k);
}

}  // namespace host
}  // namespace dtrain

#undef DTRAIN_HOST_OPTIM_LANE_LOOPS

#if defined(DTRAIN_HOST_OPTIM_NO_CONTRACT)
#undef DTRAIN_HOST_OPTIM_NO_CONTRACT
#if defined(__clang__)
#pragma float_control(pop)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif
