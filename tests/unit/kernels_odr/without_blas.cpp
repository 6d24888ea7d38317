// Translation unit built WITHOUT BLAS (DTRAIN_HAVE_CBLAS undefined, <cblas.h> never included). Its
// host::gemm must be the same function the BLAS unit calls: on the automatic path the GEMM the
// program registered (CBLAS, registered by the other unit), on the blocked path the blocked kernel.
#include <cstdint>
#include <string>

#include <dtrain/kernels/host/gemm.hpp>

#if defined(DTRAIN_HAVE_CBLAS)
#error "this translation unit must be compiled without DTRAIN_HAVE_CBLAS"
#endif

namespace odr_test {
void host_gemm_without_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                            const float* b, float* c) {
  dtrain::host::gemm<float>(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}
void blocked_gemm_without_blas(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                               const float* b, float* c) {
  dtrain::host::gemm<float>(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n,
                            dtrain::host::GemmPath::blocked);
}
std::string engine_without_blas() { return dtrain::host::BlockedGemm::name; }
}  // namespace odr_test
