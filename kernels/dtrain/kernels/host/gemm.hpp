// dtrain: host GEMM. A serial reference, a cache-blocked fallback and, when dtrain::blas is linked
// (DTRAIN_HAVE_CBLAS), CBLAS. All row-major: C[m x n] = alpha * op(A) * op(B) + beta * C.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <dtrain/core/error.hpp>

#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
#include <cblas.h>
#endif

namespace dtrain {
namespace host {

/// Which GEMM the layers use. `automatic` is CBLAS when compiled in, else the blocked fallback.
enum class GemmPath : unsigned char { automatic, reference, blocked, blas };

/// True when this translation unit was compiled with CBLAS (target dtrain::blas).
constexpr bool have_blas() noexcept {
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
  return true;
#else
  return false;
#endif
}

namespace detail {
inline void check_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  DTRAIN_REQUIRE(m >= 0 && n >= 0 && k >= 0, "gemm",
                 "negative extent m=" << m << " n=" << n << " k=" << k);
  const std::int64_t min_lda = std::max<std::int64_t>(1, ta ? m : k);
  const std::int64_t min_ldb = std::max<std::int64_t>(1, tb ? k : n);
  DTRAIN_REQUIRE(lda >= min_lda && ldb >= min_ldb && ldc >= std::max<std::int64_t>(1, n), "gemm",
                 "leading dimensions lda=" << lda << " ldb=" << ldb << " ldc=" << ldc
                                           << " too small for m=" << m << " n=" << n << " k=" << k);
}
}  // namespace detail

namespace ref {
/// Serial reference GEMM (row-major). Accumulates each dot product in double (long double for
/// double inputs) so it can judge the fast paths. Local, blocking; the caller owns all buffers.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  static_assert(std::is_floating_point_v<T>, "gemm needs float or double");
  dtrain::host::detail::check_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  using Acc = std::conditional_t<std::is_same_v<T, float>, double, long double>;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      Acc s = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const T av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const T bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        s += static_cast<Acc>(av) * static_cast<Acc>(bv);
      }
      T& out = c[i * ldc + j];
      // beta == 0 must ignore whatever C held (it may be uninitialised or NaN), as BLAS does.
      out = static_cast<T>(static_cast<Acc>(alpha) * s +
                           (beta == T(0) ? Acc(0) : static_cast<Acc>(beta) * out));
    }
}
}  // namespace ref

/// Cache-blocked GEMM without BLAS (row-major). Packs op(A) and op(B) panels so the inner loop is
/// unit-stride and vectorisable whatever the transposes. Local, blocking, allocates its packing
/// buffers per call.
template <class T>
void gemm_blocked(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc) {
  static_assert(std::is_floating_point_v<T>, "gemm needs float or double");
  detail::check_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  for (std::int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0))
      std::fill(row, row + n, T(0));
    else if (beta != T(1))
      for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
  if (k == 0 || alpha == T(0)) return;
  // Block sizes: an A panel of mc x kc and a B panel of kc x nc stay in L2; rows of the B panel
  // (nc elements) stay in L1 while four rows of C are updated.
  constexpr std::int64_t mc = 64, kc = 256, nc = 512;
  thread_local std::vector<T> apack, bpack;
  apack.resize(static_cast<std::size_t>(mc * kc));
  bpack.resize(static_cast<std::size_t>(kc * nc));
  for (std::int64_t jj = 0; jj < n; jj += nc) {
    const std::int64_t nb = std::min(nc, n - jj);
    for (std::int64_t pp = 0; pp < k; pp += kc) {
      const std::int64_t kb = std::min(kc, k - pp);
      T* bp = bpack.data();
      for (std::int64_t p = 0; p < kb; ++p)
        for (std::int64_t j = 0; j < nb; ++j)
          bp[p * nb + j] = trans_b ? b[(jj + j) * ldb + pp + p] : b[(pp + p) * ldb + jj + j];
      for (std::int64_t ii = 0; ii < m; ii += mc) {
        const std::int64_t mb = std::min(mc, m - ii);
        T* ap = apack.data();
        for (std::int64_t i = 0; i < mb; ++i)
          for (std::int64_t p = 0; p < kb; ++p)
            ap[i * kb + p] =
                alpha * (trans_a ? a[(pp + p) * lda + ii + i] : a[(ii + i) * lda + pp + p]);
        std::int64_t i = 0;
        for (; i + 4 <= mb; i += 4) {
          T* __restrict c0 = c + (ii + i) * ldc + jj;
          T* __restrict c1 = c0 + ldc;
          T* __restrict c2 = c1 + ldc;
          T* __restrict c3 = c2 + ldc;
          for (std::int64_t p = 0; p < kb; ++p) {
            const T a0 = ap[i * kb + p], a1 = ap[(i + 1) * kb + p];
            const T a2 = ap[(i + 2) * kb + p], a3 = ap[(i + 3) * kb + p];
            const T* __restrict brow = bp + p * nb;
            for (std::int64_t j = 0; j < nb; ++j) {
              const T bv = brow[j];
              c0[j] += a0 * bv;
              c1[j] += a1 * bv;
              c2[j] += a2 * bv;
              c3[j] += a3 * bv;
            }
          }
        }
        for (; i < mb; ++i) {
          T* __restrict c0 = c + (ii + i) * ldc + jj;
          for (std::int64_t p = 0; p < kb; ++p) {
            const T a0 = ap[i * kb + p];
            const T* __restrict brow = bp + p * nb;
            for (std::int64_t j = 0; j < nb; ++j) c0[j] += a0 * brow[j];
          }
        }
      }
    }
  }
}

#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
/// CBLAS sgemm/dgemm (row-major). Local, blocking; threads as the BLAS library is configured.
template <class T>
void gemm_blas(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
               const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
               std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "CBLAS gemm needs float or double");
  detail::check_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  else
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
}
#endif

/// GEMM on the chosen path (row-major). `automatic` picks CBLAS when compiled in, otherwise the
/// blocked fallback; asking for `blas` without it throws InvalidArgument. Local, blocking.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc, GemmPath path = GemmPath::automatic) {
  switch (path) {
    case GemmPath::reference:
      return ref::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmPath::blocked:
      return gemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmPath::blas:
    case GemmPath::automatic:
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
      return gemm_blas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
      DTRAIN_REQUIRE(path == GemmPath::automatic, "gemm",
                     "the BLAS path was requested but this build has no CBLAS (link dtrain::blas)");
      return gemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  }
}

}  // namespace host
}  // namespace dtrain
