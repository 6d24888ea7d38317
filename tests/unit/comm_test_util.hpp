// Test helpers for the collectives: deterministic random inputs and an independent reference
// computed in wider precision, with the error bound the algorithms must meet.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>

namespace dtrain::test {

/// Bytes of `count` random elements of `t` for rank `rank` of combination `combo`; any rank can
/// regenerate any other rank's input. Floats are exactly representable in their own type.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::vector<unsigned char> make_input(DType t, ReduceOp op, std::size_t count, int rank,
                                             std::uint64_t combo) {
  std::vector<unsigned char> out(count * size_of(t));
  const std::uint64_t seed = splitmix64(combo * 1000003ull + static_cast<std::uint64_t>(rank));
  const bool prod = op == ReduceOp::prod;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t bits = splitmix64(seed + i);
    const double unit = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
    const double f = prod ? 0.5 + unit : -2.0 + 4.0 * unit;           // [0.5,1.5) or [-2,2)
    const long long k =
        prod ? static_cast<long long>(bits % 7) - 3 : static_cast<long long>(bits % 2001) - 1000;
    switch (t) {
      case DType::f32: {
        float v = static_cast<float>(f);
        std::memcpy(&out[i * 4], &v, 4);
        break;
      }
      case DType::f64: std::memcpy(&out[i * 8], &f, 8); break;
      case DType::f16: {
        half v(static_cast<float>(f));
        std::memcpy(&out[i * 2], &v, 2);
        break;
      }
      case DType::bf16: {
        bfloat16 v(static_cast<float>(f));
        std::memcpy(&out[i * 2], &v, 2);
        break;
      }
      case DType::i32: {
        auto v = static_cast<std::int32_t>(k);
        std::memcpy(&out[i * 4], &v, 4);
        break;
      }
      case DType::i64: {
        auto v = static_cast<std::int64_t>(k);
        std::memcpy(&out[i * 8], &v, 8);
        break;
      }
    }
  }
  return out;
}

inline long double load_float(const unsigned char* p, DType t) {
  switch (t) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::f16: {
      half v;
      std::memcpy(&v, p, 2);
      return static_cast<float>(v);
    }
    case DType::bf16: {
      bfloat16 v;
      std::memcpy(&v, p, 2);
      return static_cast<float>(v);
    }
    default: return 0;
  }
}

template <class I>
I load_int(const unsigned char* p) {
  I v;
  std::memcpy(&v, p, sizeof(I));
  return v;
}

/// Checks `got` (count elements of t) against the reduction of `inputs` (one per rank).
/// Integers must match exactly (sum and prod wrap modulo 2^bits, avg truncates the exact sum).
/// Floats: with u the unit roundoff of the accumulation type (f32 for the 16-bit types), any
/// order of p-1 additions is within (p-1)·u·Σ|x| of the exact sum, p-1 multiplications within
/// (p-1)·u·|Π x| of the exact product, avg adds one division (u·|avg|), and a 16-bit result adds
/// its single rounding (u16·|result| plus half the smallest subnormal). min and max are exact.
/// Returns the index of the first bad element, or -1.
inline long long first_mismatch(DType t, ReduceOp op,
                                const std::vector<std::vector<unsigned char>>& inputs,
                                const unsigned char* got, std::size_t count,
                                std::size_t first_elem = 0) {
  const int p = static_cast<int>(inputs.size());
  const std::size_t es = size_of(t);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t e = first_elem + i;
    if (t == DType::i32 || t == DType::i64) {
      const bool is32 = t == DType::i32;
      std::uint64_t acc = 0;
      std::int64_t mn = 0, mx = 0;
      for (int r = 0; r < p; ++r) {
        const std::int64_t v = is32 ? load_int<std::int32_t>(&inputs[r][e * es])
                                    : load_int<std::int64_t>(&inputs[r][e * es]);
        if (r == 0) {
          acc = static_cast<std::uint64_t>(v);
          mn = mx = v;
          continue;
        }
        if (op == ReduceOp::prod)
          acc = is32 ? static_cast<std::uint32_t>(static_cast<std::uint32_t>(acc) *
                                                  static_cast<std::uint32_t>(v))
                     : acc * static_cast<std::uint64_t>(v);
        else
          acc = is32 ? static_cast<std::uint32_t>(static_cast<std::uint32_t>(acc) +
                                                  static_cast<std::uint32_t>(v))
                     : acc + static_cast<std::uint64_t>(v);
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      std::int64_t want;
      const std::int64_t wrapped = is32 ? static_cast<std::int64_t>(static_cast<std::int32_t>(
                                              static_cast<std::uint32_t>(acc)))
                                        : static_cast<std::int64_t>(acc);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::prod: want = wrapped; break;
        case ReduceOp::avg: want = wrapped / p; break;
        case ReduceOp::min: want = mn; break;
        default: want = mx; break;
      }
      const std::int64_t have =
          is32 ? load_int<std::int32_t>(got + i * es) : load_int<std::int64_t>(got + i * es);
      if (have != want) return static_cast<long long>(e);
      continue;
    }
    long double sum = 0, abs_sum = 0, prod = 1, mn = 0, mx = 0;
    for (int r = 0; r < p; ++r) {
      const long double v = load_float(&inputs[r][e * es], t);
      sum += v;
      abs_sum += std::fabs(v);
      prod *= v;
      if (r == 0 || v < mn) mn = v;
      if (r == 0 || v > mx) mx = v;
    }
    const long double u = t == DType::f64 ? std::ldexp(1.0L, -53) : std::ldexp(1.0L, -24);
    long double want = 0, bound = 0;
    switch (op) {
      case ReduceOp::sum:
        want = sum;
        bound = (p - 1) * u * abs_sum * 1.01L;
        break;
      case ReduceOp::avg:
        want = sum / p;
        bound = (p - 1) * u * abs_sum * 1.01L / p + u * std::fabs(want) * 1.01L;
        break;
      case ReduceOp::prod:
        want = prod;
        bound = (p - 1) * u * std::fabs(prod) * 1.01L;
        break;
      case ReduceOp::min: want = mn; break;
      case ReduceOp::max: want = mx; break;
    }
    if ((t == DType::f16 || t == DType::bf16) && op != ReduceOp::min && op != ReduceOp::max) {
      const long double u16 = t == DType::f16 ? std::ldexp(1.0L, -11) : std::ldexp(1.0L, -8);
      bound += u16 * (std::fabs(want) + bound) + std::ldexp(1.0L, -25);
    }
    const long double have = load_float(got + i * es, t);
    if (!(std::fabs(have - want) <= bound)) return static_cast<long long>(e);
  }
  return -1;
}

inline std::uint64_t fnv1a(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace dtrain::test
