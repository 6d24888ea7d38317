// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host GEMM without external libraries: a serial reference and a cache-blocked kernel.
// All row-major: C[m x n] = alpha * op(A) * op(B) + beta * C. CBLAS is a separate declaration,
// dtrain::blas::gemm in <dtrain/kernels/host/blas.hpp> (needs dtrain::blas); code picks one by type
// (host::BlockedGemm or blas::CblasGemm), never by a macro, so every translation unit that calls
// host::gemm runs the same code whether or not the program also links a BLAS.
//
// The automatic path is a run-time choice, the same in every translation unit: CBLAS once a
// program's translation unit has included blas.hpp (which registers it before main; this header
// includes it wherever the dtrain::blas target is linked, which defines DTRAIN_HAVE_CBLAS), the
// blocked kernel otherwise. So HostExec, the default policy of dtrain::Sequential, runs CBLAS in a
// program that links the blas component, and its bits do not depend on which unit made the call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain {
namespace host {

/// Which host GEMM host::gemm runs: `automatic` is CBLAS when the program registered it (see
/// linked_gemm) and the cache-blocked kernel otherwise, `blocked` always the cache-blocked kernel,
/// `reference` the serial reference.
enum class GemmPath : unsigned char { automatic, reference, blocked };

/// A row-major GEMM function with host::gemm's arguments (no path).
template <class T>
using GemmFunction = void (*)(bool, bool, std::int64_t, std::int64_t, std::int64_t, T, const T*,
                              std::int64_t, const T*, std::int64_t, T, T*, std::int64_t);

/// The GEMM that GemmPath::automatic runs instead of the blocked kernel: null until a library GEMM
/// registers itself (<dtrain/kernels/host/blas.hpp> does, during static initialisation). One per
/// process and scalar type; reads and writes are atomic.
template <class T>
std::atomic<GemmFunction<T>>& linked_gemm() noexcept {
  static std::atomic<GemmFunction<T>> f{nullptr};
  return f;
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

namespace detail {
// Register-blocked micro-kernel: an MR x NR tile of C accumulated over kb steps of the packed
// panels (A: MR values per step, B: NR values per step), then added to C (mr x nr valid).
template <class T, int MR, int NR>
inline void gemm_micro(std::int64_t kb, const T* __restrict ap, const T* __restrict bp,
                       T* __restrict c, std::int64_t ldc, int mr, int nr) {
  T acc[MR][NR] = {};
  for (std::int64_t p = 0; p < kb; ++p) {
    const T* a = ap + p * MR;
    const T* b = bp + p * NR;
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) c[i * ldc + j] += acc[i][j];
}
}  // namespace detail

/// Cache-blocked GEMM without BLAS (row-major). Packs op(A) and op(B) into zero-padded panels so a
/// register-blocked micro-kernel runs unit-stride and vectorised whatever the transposes. Local,
/// blocking; its packing buffers are per thread and grow once.
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
  // MR x NR = 2 x 16 keeps the accumulators in the 16 SSE registers of baseline x86-64 (measured
  // best among 1x32, 2x8, 2x16, 4x4, 4x8, 4x16, 8x8). The packed A block (mc x kc, 128 KiB) and
  // B panel (kc x nc, 512 KiB) stay in a 1 MiB L2; one B micro-panel (kc x NR) stays in L1.
  constexpr int MR = 2, NR = 16;
  constexpr std::int64_t mc = 128, kc = 256, nc = 512;
  static_assert(mc % MR == 0 && nc % NR == 0, "blocks must hold whole micro-tiles");
  thread_local std::vector<T> apack, bpack;
  apack.resize(static_cast<std::size_t>(mc * kc));
  bpack.resize(static_cast<std::size_t>(kc * nc));
  for (std::int64_t jj = 0; jj < n; jj += nc) {
    const std::int64_t nb = std::min(nc, n - jj);
    for (std::int64_t pp = 0; pp < k; pp += kc) {
      const std::int64_t kb = std::min(kc, k - pp);
      for (std::int64_t j0 = 0; j0 < nb; j0 += NR) {
        T* dst = bpack.data() + (j0 / NR) * kb * NR;
        const std::int64_t nr = std::min<std::int64_t>(NR, nb - j0);
        for (std::int64_t p = 0; p < kb; ++p)
          for (std::int64_t j = 0; j < NR; ++j) {
            const std::int64_t col = jj + j0 + j, kk = pp + p;
            dst[p * NR + j] = j < nr ? (trans_b ? b[col * ldb + kk] : b[kk * ldb + col]) : T(0);
          }
      }
      for (std::int64_t ii = 0; ii < m; ii += mc) {
        const std::int64_t mb = std::min(mc, m - ii);
        for (std::int64_t i0 = 0; i0 < mb; i0 += MR) {
          T* dst = apack.data() + (i0 / MR) * kb * MR;
          const std::int64_t mr = std::min<std::int64_t>(MR, mb - i0);
          for (std::int64_t p = 0; p < kb; ++p)
            for (std::int64_t i = 0; i < MR; ++i) {
              const std::int64_t row = ii + i0 + i, kk = pp + p;
              dst[p * MR + i] =
                  i < mr ? alpha * (trans_a ? a[kk * lda + row] : a[row * lda + kk]) : T(0);
            }
        }
        for (std::int64_t j0 = 0; j0 < nb; j0 += NR)
          for (std::int64_t i0 = 0; i0 < mb; i0 += MR)
            detail::gemm_micro<T, MR, NR>(kb, apack.data() + (i0 / MR) * kb * MR,
                                          bpack.data() + (j0 / NR) * kb * NR,
                                          c + (ii + i0) * ldc + jj + j0, ldc,
                                          static_cast<int>(std::min<std::int64_t>(MR, mb - i0)),
                                          static_cast<int>(std::min<std::int64_t>(NR, nb - j0)));
      }
    }
  }
}

/// GEMM on the chosen path (row-major, see GemmPath). Local, blocking; the caller owns all
/// buffers. Throws InvalidArgument on bad extents.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc, GemmPath path = GemmPath::automatic) {
  if (path == GemmPath::reference)
    return ref::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (path == GemmPath::automatic)
    if (const GemmFunction<T> f = linked_gemm<T>().load(std::memory_order_acquire))
      return f(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  gemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// GEMM engine running gemm_blocked: a type, so an execution policy picks its GEMM by type
/// (blas::CblasGemm is the CBLAS one). Stateless, thread-safe.
struct BlockedGemm {
  static constexpr const char* name = "blocked";
  template <class T>
  void operator()(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc) const {
    gemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

}  // namespace host
}  // namespace dtrain

// Where the dtrain::blas target is linked, CBLAS becomes the automatic GEMM of the whole program
// (see the top of this file). Only an include: no inline function here changes with the macro.
#if defined(DTRAIN_HAVE_CBLAS)
#include <dtrain/kernels/host/blas.hpp>
#endif
