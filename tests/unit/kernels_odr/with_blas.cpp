// Translation unit built WITH BLAS (dtrain::blas: DTRAIN_HAVE_CBLAS=1 and <cblas.h>). It calls the
// same host::gemm as the unit without BLAS, plus the separate blas::gemm; including blas.hpp
// registers CBLAS as the program's automatic GEMM.
#include <cstdint>
#include <string>

#include <cblas.h>

#include <dtrain/kernels/host/blas.hpp>
#include <dtrain/kernels/host/blas_exec.hpp>
#include <dtrain/kernels/host/gemm.hpp>

#if !defined(DTRAIN_HAVE_CBLAS)
#error "this translation unit must be compiled with dtrain::blas"
#endif

namespace odr_test {
void host_gemm_with_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                         const float* b, float* c) {
  dtrain::host::gemm<float>(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
void blocked_gemm_with_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                            const float* b, float* c) {
  dtrain::host::gemm<float>(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n,
                            dtrain::host::GemmPath::blocked);
}
void host_exec_gemm_with_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                              const float* b, float* c) {
  dtrain::HostExec exec;
  exec.gemm(exec.compute_stream(), false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
void blas_gemm_with_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                         const float* b, float* c) {
  dtrain::blas::gemm<float>(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
void engine_call_with_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                           const float* b, float* c) {
  dtrain::blas::CblasGemm{}(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
void exec_gemm_with_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                         const float* b, float* c) {
  dtrain::HostBlasExec exec;
  exec.gemm(exec.compute_stream(), false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
void cblas_direct(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                  float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(k), 0.0f, c,
              static_cast<int>(n));
}
std::string engine_with_blas() { return dtrain::blas::CblasGemm::name; }
}  // namespace odr_test
