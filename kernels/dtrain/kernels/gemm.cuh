// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device GEMM, row-major C[m x n] = alpha op(A) op(B) + beta C. A shared-memory tiled
// kernel written once for CUDA and HIP and, when the translation unit has cuBLAS / hipBLAS, the
// vendor_gemm wrapper. Engines (TiledGemm, VendorGemm) let an execution policy choose by type.
#pragma once

#include <cstdint>

#include <dtrain/core/error.hpp>
#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
// Block tile BM x BN, K step BK; each of the (BM/TM)*(BN/TN) threads owns a TM x TN patch whose
// rows and columns are strided by the thread grid, so shared-memory reads are consecutive.
template <class T, int BM, int BN, int BK, int TM, int TN>
__global__ void gemm_tiled(bool ta, bool tb, int m, int n, int k, T alpha, const T* __restrict__ a,
                           int lda, const T* __restrict__ b, int ldb, T beta, T* __restrict__ c,
                           int ldc) {
  constexpr int threads = (BM / TM) * (BN / TN);
  __shared__ T as[BK][BM];
  __shared__ T bs[BK][BN];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  const int row0 = static_cast<int>(blockIdx.y) * BM, col0 = static_cast<int>(blockIdx.x) * BN;
  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

  for (int k0 = 0; k0 < k; k0 += BK) {
    // Load the tiles; the index order follows the contiguous axis of each operand in memory.
    for (int l = tid; l < BM * BK; l += threads) {
      int i, p;
      if (ta) {
        i = l % BM;
        p = l / BM;
      } else {
        p = l % BK;
        i = l / BK;
      }
      const int gi = row0 + i, gp = k0 + p;
      T v = T(0);
      if (gi < m && gp < k)
        v = ta ? a[static_cast<std::int64_t>(gp) * lda + gi]
               : a[static_cast<std::int64_t>(gi) * lda + gp];
      as[p][i] = v;
    }
    for (int l = tid; l < BK * BN; l += threads) {
      int j, p;
      if (tb) {
        p = l % BK;
        j = l / BK;
      } else {
        j = l % BN;
        p = l / BN;
      }
      const int gj = col0 + j, gp = k0 + p;
      T v = T(0);
      if (gj < n && gp < k)
        v = tb ? b[static_cast<std::int64_t>(gj) * ldb + gp]
               : b[static_cast<std::int64_t>(gp) * ldb + gj];
      bs[p][j] = v;
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < BK; ++p) {
      T ar[TM], br[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) ar[i] = as[p][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) br[j] = bs[p][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += ar[i] * br[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int gi = row0 + ty + i * (BM / TM);
    if (gi >= m) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int gj = col0 + tx + j * (BN / TN);
      if (gj >= n) continue;
      T& out = c[static_cast<std::int64_t>(gi) * ldc + gj];
      out = beta == T(0) ? alpha * acc[i][j] : alpha * acc[i][j] + beta * out;
    }
  }
}
}  // namespace kernels

/// The tiled kernel on `stream` (asynchronous). Device pointers; extents must fit in int.
/// Throws InvalidArgument on bad extents, DeviceError on a failed launch.
template <class T>
void gemm_tiled(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                std::int64_t ldc, stream_t stream = nullptr) {
  DTRAIN_REQUIRE(
      m >= 0 && n >= 0 && k >= 0 && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31),
      "gpu::gemm", "extents m=" << m << " n=" << n << " k=" << k << " out of range");
  if (m == 0 || n == 0) return;
  constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
  const dim3 grid(static_cast<unsigned>((n + BN - 1) / BN),
                  static_cast<unsigned>((m + BM - 1) / BM));
  kernels::gemm_tiled<T, BM, BN, BK, TM, TN><<<grid, (BM / TM) * (BN / TN), 0, stream>>>(
      ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
      static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  check_launch("gpu::gemm_tiled");
}

/// Device GEMM with dtrain's tiled kernel (the same as gemm_tiled). Local, asynchronous on
/// `stream`; device pointers owned by the caller.
template <class T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc,
          stream_t stream = nullptr) {
  gemm_tiled(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}

/// GEMM engine running the tiled kernel: a type, so an execution policy picks its GEMM by type
/// (GpuExec<TiledGemm>) rather than by a macro inside an inline body. Stateless, thread-safe.
struct TiledGemm {
  static constexpr const char* name = "tiled";
  template <class T>
  void operator()(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                  const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc, stream_t stream) const {
    gemm_tiled(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
  }
};

#if defined(DTRAIN_GPU_VENDOR_BLAS)
// Declared only when the translation unit has cuBLAS / hipBLAS (DTRAIN_HAVE_CUBLAS /
// DTRAIN_HAVE_HIPBLAS): the macro adds these declarations and changes no other body.
namespace detail {
// One library handle per host thread, created on first use and rebound to the caller's stream.
inline blas_handle_t thread_blas_handle() {
  struct Holder {
    blas_handle_t h = blas_create();
    ~Holder() { blas_destroy(h); }
  };
  thread_local Holder holder;
  return holder.h;
}
}  // namespace detail

/// cuBLAS / hipBLAS GEMM, row-major, on `stream` (f32, f64). Local, asynchronous; one library
/// handle per host thread. Throws InvalidArgument on bad extents, DeviceError on a library error.
template <class T>
void vendor_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                 const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                 std::int64_t ldc, stream_t stream = nullptr) {
  DTRAIN_REQUIRE(
      m >= 0 && n >= 0 && k >= 0 && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31),
      "gpu::vendor_gemm", "extents m=" << m << " n=" << n << " k=" << k << " out of range");
  if (m == 0 || n == 0) return;
  const blas_handle_t h = detail::thread_blas_handle();
  blas_set_stream(h, stream);
  blas_gemm<T>(h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
               static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

/// GEMM engine calling the vendor library (GpuExec<VendorGemm>). Thread-safe.
struct VendorGemm {
  static constexpr const char* name = "vendor";
  template <class T>
  void operator()(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                  const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc, stream_t stream) const {
    vendor_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
  }
};
#endif

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain
