#include <doctest/doctest.h>

#include <dtrain/core/dtype.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <dtrain/core/rng.hpp>

using dtrain::bfloat16;
using dtrain::half;

namespace {

// Independent reference: the nearest representable 16-bit value found by searching the sorted
// list of all finite values of the format, ties to the even bit pattern; overflow handled by the
// IEEE rule (values at or beyond max + half an ulp round to infinity).
struct Table {
  std::vector<std::pair<double, std::uint16_t>> finite;  // value -> bits, non-negative only
  double max_value = 0, overflow_threshold = 0;
};

template <class ToFloat>
Table make_table(ToFloat to_float, int mantissa_bits) {
  Table t;
  for (std::uint32_t b = 0; b < 0x8000u; ++b) {
    const float f = to_float(static_cast<std::uint16_t>(b));
    if (std::isfinite(f))
      t.finite.push_back({static_cast<double>(f), static_cast<std::uint16_t>(b)});
  }
  std::sort(t.finite.begin(), t.finite.end());
  t.max_value = t.finite.back().first;
  const double ulp = t.max_value - t.finite[t.finite.size() - 2].first;
  t.overflow_threshold = t.max_value + ulp / 2;
  (void)mantissa_bits;
  return t;
}

std::uint16_t reference_round(const Table& t, float f, std::uint16_t inf_bits) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= t.overflow_threshold) return static_cast<std::uint16_t>(sign | inf_bits);
  auto it = std::lower_bound(t.finite.begin(), t.finite.end(), std::make_pair(a, std::uint16_t(0)));
  if (it == t.finite.end()) return static_cast<std::uint16_t>(sign | t.finite.back().second);
  if (it->first == a || it == t.finite.begin())
    return static_cast<std::uint16_t>(sign | it->second);
  auto lo = it - 1;
  const double dlo = a - lo->first, dhi = it->first - a;
  std::uint16_t pick;
  if (dlo < dhi)
    pick = lo->second;
  else if (dhi < dlo)
    pick = it->second;
  else
    pick = (lo->second & 1u) ? it->second : lo->second;
  return static_cast<std::uint16_t>(sign | pick);
}

float random_float(dtrain::RngStream& r) {
  // Mix of arbitrary bit patterns and values near the 16-bit formats' ranges.
  switch (r.below(3)) {
    case 0: {
      std::uint32_t u = r.next_u32();
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case 1:
      return static_cast<float>((r.uniform_double() * 2 - 1) *
                                std::ldexp(1.0, static_cast<int>(r.below(44)) - 28));
    default: return static_cast<float>((r.uniform_double() * 2 - 1) * 65536.0);
  }
}

}  // namespace

TEST_CASE("half: every 16-bit pattern round-trips exactly through float") {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const half h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    const half back(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(back)));
    } else {
      CHECK(back.bits == h.bits);
    }
  }
}

TEST_CASE("bfloat16: every 16-bit pattern round-trips exactly through float") {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const bfloat16 h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    const bfloat16 back(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(back)));
    } else {
      CHECK(back.bits == h.bits);
    }
  }
}

TEST_CASE("half and bfloat16 round to nearest even, against a table search") {
  const Table th =
      make_table([](std::uint16_t b) { return static_cast<float>(half::from_bits(b)); }, 10);
  const Table tb =
      make_table([](std::uint16_t b) { return static_cast<float>(bfloat16::from_bits(b)); }, 7);
  CHECK(th.max_value == 65504.0);
  dtrain::RngStream r(2024, 1);
  for (int i = 0; i < 200000; ++i) {
    const float f = random_float(r);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(half(f))));
      CHECK(std::isnan(static_cast<float>(bfloat16(f))));
      continue;
    }
    REQUIRE(half(f).bits == reference_round(th, f, 0x7c00u));
    REQUIRE(bfloat16(f).bits == reference_round(tb, f, 0x7f80u));
  }
  // Exact ties and edges.
  CHECK(half(1.0f + std::ldexp(1.0f, -11)).bits == half(1.0f).bits);          // tie -> even (down)
  CHECK(half(1.0f + 3 * std::ldexp(1.0f, -11)).bits == half(1.0f).bits + 2);  // tie -> even (up)
  CHECK(half(65520.0f).bits == 0x7c00u);                                      // rounds to inf
  CHECK(half(65519.0f).bits == 0x7bffu);
  CHECK(half(std::ldexp(1.0f, -24)).bits == 0x0001u);  // smallest subnormal
  CHECK(half(std::ldexp(1.0f, -25)).bits == 0x0000u);  // tie -> even zero
  CHECK(half(std::ldexp(1.5f, -25)).bits == 0x0001u);
  CHECK(half(-0.0f).bits == 0x8000u);
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80u);
}

#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__aarch64__))
TEST_CASE("half conversion agrees with the compiler's _Float16") {
  dtrain::RngStream r(99, 3);
  for (int i = 0; i < 200000; ++i) {
    const float f = random_float(r);
    if (std::isnan(f)) continue;
    const _Float16 c = static_cast<_Float16>(f);
    std::uint16_t cb;
    std::memcpy(&cb, &c, 2);
    REQUIRE(half(f).bits == cb);
  }
}
#endif

TEST_CASE("dtype names, sizes and parsing") {
  using dtrain::DType;
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64})
    CHECK(dtrain::dtype_from_name(dtrain::name_of(t)) == t);
  CHECK(dtrain::size_of(DType::bf16) == 2);
  CHECK(dtrain::size_of(DType::i64) == 8);
  CHECK_THROWS_AS(dtrain::dtype_from_name("f8"), dtrain::InvalidArgument);
  CHECK(dtrain::dtype_of_v<half> == DType::f16);
  CHECK(dtrain::dtype_of_v<const double> == DType::f64);
}
