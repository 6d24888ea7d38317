// The one reduction contract (<dtrain/kernels/host/reduce.hpp>) against independent references:
// float64 sums rounded once for the 16-bit floats, modular arithmetic done in 64/128-bit integers
// for the wrap-around, and the collectives over loopback holding the same contract end to end.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/kernels/host/reduce.hpp>
#include <dtrain/transports/loopback.hpp>

#include "comm_test_util.hpp"

using namespace dtrain;

namespace {

// Halves in [1/16, 16) with 11 significant bits: a sum of up to 8 of them needs at most 22 bits,
// so f32 holds it exactly and the only rounding the contract allows is the final one.
template <class H>
H exact_friendly(std::uint64_t bits) {
  const int e = static_cast<int>(bits % 8) - 4;                           // 2^-4 .. 2^3
  const double m = 1.0 + static_cast<double>((bits >> 8) % 1024) / 1024;  // 11 significant bits
  const double sign = (bits >> 20) & 1 ? -1.0 : 1.0;
  return H(static_cast<float>(sign * std::ldexp(m, e)));
}

template <class H>
void check_single_rounding() {
  const int ranks = 7;
  const std::size_t n = 4096;
  std::vector<std::vector<H>> in(ranks, std::vector<H>(n));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) in[r][i] = exact_friendly<H>(test::splitmix64(r * n + i));
  // The contract: widen once, accumulate in f32, round once.
  std::vector<float> acc(n);
  host::widen(in[0].data(), acc.data(), n);
  for (int r = 1; r < ranks; ++r) host::reduce_into(ReduceOp::sum, acc.data(), in[r].data(), n);
  std::vector<H> got(n);
  host::narrow(acc.data(), got.data(), n);
  // Rounding after every combine (what the contract rules out) for comparison.
  std::vector<H> each = in[0];
  for (int r = 1; r < ranks; ++r) host::reduce_into(ReduceOp::sum, each.data(), in[r].data(), n);
  std::size_t bad = 0, differs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double exact = 0;
    for (int r = 0; r < ranks; ++r) exact += static_cast<double>(static_cast<float>(in[r][i]));
    const H want(static_cast<float>(exact));  // exact in f32, so this is one rounding of `exact`
    if (got[i].bits != want.bits) ++bad;
    if (each[i].bits != want.bits) ++differs;
  }
  CHECK(bad == 0);
  CHECK(differs > 0);  // the inputs do tell single from repeated rounding
}

// Two's-complement wrap of an exact integer (independent of the kernels' unsigned arithmetic).
template <class I>
I wrap(__int128 v) {
  constexpr int bits = 8 * sizeof(I);
  const __int128 mod = static_cast<__int128>(1) << bits;
  __int128 m = v % mod;
  if (m < 0) m += mod;
  if (m >= mod / 2) m -= mod;
  return static_cast<I>(m);
}

template <class I>
void check_wrap() {
  const I hi = std::numeric_limits<I>::max(), lo = std::numeric_limits<I>::min();
  const I a[] = {hi, lo, hi, -1, hi / 3 + 7, lo + 5};
  const I b[] = {1, -1, hi, lo, 5, lo + 9};
  const std::size_t n = sizeof(a) / sizeof(a[0]);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::avg}) {
    I acc[n], out[n];
    std::memcpy(acc, a, sizeof(a));
    host::reduce_into(op, acc, b, n);
    host::reduce(op, out, a, b, n);
    if (op == ReduceOp::avg) host::scale_avg(acc, n, 2);
    for (std::size_t i = 0; i < n; ++i) {
      const __int128 x = a[i], y = b[i];
      I want = op == ReduceOp::prod ? wrap<I>(x * y) : wrap<I>(x + y);
      const I sum = want;
      if (op == ReduceOp::avg) want = static_cast<I>(sum / 2);
      CAPTURE(i);
      CHECK(acc[i] == want);
      if (op != ReduceOp::avg) CHECK(out[i] == want);
    }
  }
}

}  // namespace

TEST_CASE("16-bit floats accumulate in f32 and round once") {
  check_single_rounding<half>();
  check_single_rounding<bfloat16>();
}

TEST_CASE("integer sum and product wrap around like two's complement") {
  check_wrap<std::int32_t>();
  check_wrap<std::int64_t>();
}

TEST_CASE("operand order: the accumulator comes first, min and max keep it on ties") {
  const float zp = 0.0f, zm = -0.0f;
  float acc[2] = {zp, zm};
  const float in[2] = {zm, zp};
  host::reduce_into(ReduceOp::min, acc, in, 2);
  CHECK(!std::signbit(acc[0]));  // -0 < +0 is false: the accumulator stays
  CHECK(std::signbit(acc[1]));
  host::reduce_into(ReduceOp::max, acc, in, 2);
  CHECK(!std::signbit(acc[0]));
  CHECK(std::signbit(acc[1]));
  CHECK_THROWS_AS(host::reduce(ReduceOp::sum, DType::f16, acc, acc, in, 1), InvalidArgument);
}

TEST_CASE("every all-reduce algorithm applies the contract: f16 rounded once, integers wrap") {
  const int p = 4;
  const std::size_t n = 777;
  for (auto algo : {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
                    AllreduceAlgorithm::rd, AllreduceAlgorithm::shm}) {
    CAPTURE(name_of(algo));
    std::vector<int> bad(p, -1);
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c;
      c.segment_bytes = 256;
      c.timeout_s = 60;
      Communicator comm(t, c);
      const int r = t.rank();
      std::vector<half> h(n);
      std::vector<std::int32_t> k(n);
      for (std::size_t i = 0; i < n; ++i) {
        h[i] = exact_friendly<half>(test::splitmix64(r * n + i));
        k[i] = std::numeric_limits<std::int32_t>::max() - static_cast<std::int32_t>(i) * (r + 1);
      }
      comm.allreduce(BufferView(h.data(), n, DType::f16), ReduceOp::sum, algo);
      comm.allreduce(BufferView(k.data(), n, DType::i32), ReduceOp::sum, algo);
      int wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double exact = 0;
        __int128 isum = 0;
        for (int q = 0; q < p; ++q) {
          exact += static_cast<float>(exact_friendly<half>(test::splitmix64(q * n + i)));
          isum += std::numeric_limits<std::int32_t>::max() - static_cast<__int128>(i) * (q + 1);
        }
        if (h[i].bits != half(static_cast<float>(exact)).bits) ++wrong;
        if (k[i] != wrap<std::int32_t>(isum)) ++wrong;
      }
      bad[r] = wrong;
    });
    for (int b : bad) CHECK(b == 0);
  }
}
