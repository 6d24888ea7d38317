// Feature macros add or remove declarations and never change an inline body: a program that links
// one translation unit built with BLAS and one built without gets, in each, the documented
// behaviour. host::gemm's automatic path is the GEMM the program registered, the same in both
// units: CBLAS here, since the BLAS unit includes <dtrain/kernels/host/blas.hpp> (bit for bit the
// same as cblas_sgemm called directly), and so is the default HostExec's; its blocked path is the
// blocked kernel in both (bit for bit the same as gemm_blocked called here); blas::gemm, declared
// only where blas.hpp is included, is CBLAS. Before the split host::gemm's body depended on
// DTRAIN_HAVE_CBLAS and the linker kept one of the two bodies for both units.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/kernels/host/gemm.hpp>

namespace odr_test {
void host_gemm_without_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                            float*);
std::string engine_without_blas();
void blocked_gemm_without_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                               float*);
void blocked_gemm_with_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                            float*);
void host_exec_gemm_with_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                              float*);
void host_gemm_with_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                         float*);
void blas_gemm_with_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                         float*);
void engine_call_with_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                           float*);
void exec_gemm_with_blas(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                         float*);
void cblas_direct(std::int64_t, std::int64_t, std::int64_t, const float*, const float*, float*);
std::string engine_with_blas();
}  // namespace odr_test

namespace {
std::vector<float> random_vec(std::size_t n, std::uint64_t seed) {
  dtrain::RngStream rng(seed, 5);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(2.0 * rng.uniform_double() - 1.0);
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

TEST_CASE("host::gemm is one GEMM in units built with and without BLAS: CBLAS once registered") {
  // k = 300 spans two K blocks of the blocked kernel, so its summation order differs from
  // OpenBLAS's and from the serial reference: equal bits identify the implementation.
  const std::int64_t m = 37, n = 41, k = 300;
  const auto a = random_vec(static_cast<std::size_t>(m * k), 1);
  const auto b = random_vec(static_cast<std::size_t>(n * k), 2);
  const std::size_t cn = static_cast<std::size_t>(m * n);
  std::vector<float> blocked(cn), without(cn, 7.0f), with(cn, 7.0f), blas(cn, 7.0f),
      engine(cn, 7.0f), exec(cn, 7.0f), direct(cn, 7.0f), blocked_without(cn, 7.0f),
      blocked_with(cn, 7.0f), host_exec(cn, 7.0f);
  dtrain::host::gemm_blocked<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                                    blocked.data(), n);
  odr_test::host_gemm_without_blas(m, n, k, a.data(), b.data(), without.data());
  odr_test::host_gemm_with_blas(m, n, k, a.data(), b.data(), with.data());
  odr_test::blas_gemm_with_blas(m, n, k, a.data(), b.data(), blas.data());
  odr_test::engine_call_with_blas(m, n, k, a.data(), b.data(), engine.data());
  odr_test::exec_gemm_with_blas(m, n, k, a.data(), b.data(), exec.data());
  odr_test::cblas_direct(m, n, k, a.data(), b.data(), direct.data());
  odr_test::blocked_gemm_without_blas(m, n, k, a.data(), b.data(), blocked_without.data());
  odr_test::blocked_gemm_with_blas(m, n, k, a.data(), b.data(), blocked_with.data());
  odr_test::host_exec_gemm_with_blas(m, n, k, a.data(), b.data(), host_exec.data());

  const bool registered = dtrain::host::linked_gemm<float>().load() != nullptr;
  CHECK(registered);
  CHECK(same_bits(without, direct));
  CHECK(same_bits(with, direct));
  CHECK(same_bits(host_exec, direct));  // the default policy runs the registered CBLAS
  CHECK(same_bits(blocked_without, blocked));
  CHECK(same_bits(blocked_with, blocked));
  CHECK(same_bits(blas, direct));
  CHECK(same_bits(engine, direct));
  CHECK(same_bits(exec, direct));  // HostBlasExec: the policy-level choice of CBLAS
  CHECK(odr_test::engine_without_blas() == "blocked");
  CHECK(odr_test::engine_with_blas() == "cblas");
  // Both are correct products: the serial reference (double accumulation) agrees to f32 accuracy.
  std::vector<float> want(cn);
  dtrain::host::ref::gemm<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                                 want.data(), n);
  for (std::size_t i = 0; i < cn; ++i) {
    CHECK(std::abs(blocked[i] - want[i]) < 1e-4f);
    CHECK(std::abs(direct[i] - want[i]) < 1e-4f);
  }
  // The two implementations really differ somewhere (otherwise the bit checks above would not
  // tell which one ran).
  CHECK_FALSE(same_bits(blocked, direct));
}
