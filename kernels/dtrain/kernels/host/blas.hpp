// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host GEMM through CBLAS. Needs the dtrain::blas target (it puts <cblas.h> on the include
// path and links OpenBLAS or another CBLAS); include it only where that target is linked.
//
// This is a separate declaration, dtrain::blas::gemm, not a branch inside host::gemm: whether a
// translation unit includes this header changes what it can call, never what host::gemm does, so
// translation units built with and without BLAS cannot disagree about one inline function.
//
// Including it also makes CBLAS the automatic path of host::gemm for the whole program (see
// <dtrain/kernels/host/gemm.hpp>), so the default HostExec runs it.
//
// The first call sets the BLAS library's threads for the process unless the user chose them
// (blas_threads.hpp: DTRAIN_BLAS_THREADS, or the affinity mask shared by the node's ranks).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cblas.h>

#include <dtrain/kernels/host/blas_threads.hpp>
#include <dtrain/kernels/host/gemm.hpp>

namespace dtrain {
namespace blas {

/// CBLAS sgemm/dgemm, row-major C[m x n] = alpha op(A) op(B) + beta C (beta 0 ignores C's old
/// contents). Local, blocking; threads as configure_threads() set them on the process's first
/// call; the caller owns all buffers. Throws InvalidArgument on bad extents or leading
/// dimensions, or (first call) on a malformed DTRAIN_BLAS_THREADS.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "CBLAS gemm needs float or double");
  host::detail::check_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  configure_threads();
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

namespace detail {
template <class T>
bool register_cblas() {
  host::linked_gemm<T>().store(&gemm<T>, std::memory_order_release);
  return true;
}
// Registers CBLAS as host::gemm's automatic path, once per program, before main (an inline
// variable: one definition however many units include this header).
inline const bool cblas_registered = register_cblas<float>() && register_cblas<double>();
}  // namespace detail

/// GEMM engine calling CBLAS (the counterpart of host::BlockedGemm). Stateless, thread-safe.
struct CblasGemm {
  static constexpr const char* name = "cblas";
  template <class T>
  void operator()(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc) const {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

}  // namespace blas
}  // namespace dtrain
