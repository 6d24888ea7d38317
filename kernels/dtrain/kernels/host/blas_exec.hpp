// SPDX-License-Identifier: BSD-3-Clause
// dtrain: HostBlasExec, the host execution policy with CBLAS for GEMM. Needs dtrain::blas.
//
// The BLAS choice is a type (HostExec vs HostBlasExec), not a macro: a model built on
// HostBlasExec runs CBLAS in every translation unit, one built on HostExec runs the blocked
// kernel in every translation unit, whatever else the program links.
#pragma once

#include <cstdint>

#include <dtrain/exec/host_exec.hpp>
#include <dtrain/kernels/host/blas.hpp>

namespace dtrain {

/// HostExec whose gemm calls dtrain::blas::gemm (CBLAS); everything else is HostExec's. Local
/// policy object, thread-safe as HostExec; the allocator is borrowed and must outlive it.
class HostBlasExec : public HostExec {
 public:
  /// Local. Sets the process's BLAS threads if no earlier call did (blas::configure_threads),
  /// so the count is logged, and a malformed DTRAIN_BLAS_THREADS reported, before training.
  /// Throws InvalidArgument when `alloc` does not hand out host memory, or for that variable.
  explicit HostBlasExec(Allocator& alloc = default_allocator()) : HostExec(alloc) {
    blas::configure_threads();
  }

  /// The process-wide default instance (default allocator).
  static HostBlasExec& instance() {
    static HostBlasExec exec;
    return exec;
  }

  /// Row-major GEMM through CBLAS, run at once on the calling thread.
  template <class T>
  void gemm(stream_type, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
            const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc) const {
    blas::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

static_assert(is_exec_policy_v<HostBlasExec>, "HostBlasExec satisfies the policy");

}  // namespace dtrain
