// dtrain: element-wise reduction kernels used by the collective algorithms (host memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

// Integer sum and product wrap modulo 2^bits (computed in the unsigned type, so no undefined
// behaviour and the same result in any reduction order).
template <class T>
inline T wrap_add(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
inline T wrap_mul(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// dst[i] = a[i] op b[i]; dst may alias a or b (the loops read both before writing). avg reduces
// like sum; the division happens once, in finalize_avg.
template <class T>
inline void reduce_typed(T* dst, const T* a, const T* b, std::size_t n, ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < n; ++i) dst[i] = wrap_add(a[i], b[i]);
      break;
    case ReduceOp::prod:
      for (std::size_t i = 0; i < n; ++i) dst[i] = wrap_mul(a[i], b[i]);
      break;
    case ReduceOp::min:
      for (std::size_t i = 0; i < n; ++i) dst[i] = b[i] < a[i] ? b[i] : a[i];
      break;
    case ReduceOp::max:
      for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] < b[i] ? b[i] : a[i];
      break;
  }
}

/// dst = a op b over n elements of dtype t (f32 f64 i32 i64; 16-bit floats are widened before
/// they reach the algorithms).
inline void reduce_into(void* dst, const void* a, const void* b, std::size_t n, DType t,
                        ReduceOp op) {
  if (n == 0) return;
  switch (t) {
    case DType::f32:
      reduce_typed(static_cast<float*>(dst), static_cast<const float*>(a),
                   static_cast<const float*>(b), n, op);
      return;
    case DType::f64:
      reduce_typed(static_cast<double*>(dst), static_cast<const double*>(a),
                   static_cast<const double*>(b), n, op);
      return;
    case DType::i32:
      reduce_typed(static_cast<std::int32_t*>(dst), static_cast<const std::int32_t*>(a),
                   static_cast<const std::int32_t*>(b), n, op);
      return;
    case DType::i64:
      reduce_typed(static_cast<std::int64_t*>(dst), static_cast<const std::int64_t*>(a),
                   static_cast<const std::int64_t*>(b), n, op);
      return;
    case DType::f16:
    case DType::bf16: break;
  }
  raise<InvalidArgument>("reduce", detail::concat("no direct kernel for ", name_of(t)));
}

/// Divides n elements by p in place (the avg of a finished sum). Integers truncate toward zero.
inline void finalize_avg(void* data, std::size_t n, DType t, int p) {
  if (n == 0 || p == 1) return;
  switch (t) {
    case DType::f32: {
      auto* d = static_cast<float*>(data);
      const float q = static_cast<float>(p);
      for (std::size_t i = 0; i < n; ++i) d[i] /= q;
      return;
    }
    case DType::f64: {
      auto* d = static_cast<double*>(data);
      const double q = p;
      for (std::size_t i = 0; i < n; ++i) d[i] /= q;
      return;
    }
    case DType::i32: {
      auto* d = static_cast<std::int32_t*>(data);
      for (std::size_t i = 0; i < n; ++i) d[i] /= p;
      return;
    }
    case DType::i64: {
      auto* d = static_cast<std::int64_t*>(data);
      for (std::size_t i = 0; i < n; ++i) d[i] /= p;
      return;
    }
    case DType::f16:
    case DType::bf16: break;
  }
  raise<InvalidArgument>("reduce", detail::concat("no direct kernel for ", name_of(t)));
}

/// Widens n 16-bit floats to f32 (exact).
inline void widen_to_f32(float* dst, const void* src, std::size_t n, DType t) noexcept {
  const auto* s = static_cast<const std::uint16_t*>(src);
  if (t == DType::f16)
    for (std::size_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(s[i]);
  else
    for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(s[i]);
}

/// Rounds n f32 values to 16-bit floats, to nearest even (the one rounding of the result).
inline void narrow_from_f32(void* dst, const float* src, std::size_t n, DType t) noexcept {
  auto* d = static_cast<std::uint16_t*>(dst);
  if (t == DType::f16)
    for (std::size_t i = 0; i < n; ++i) d[i] = float_to_half_bits(src[i]);
  else
    for (std::size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(src[i]);
}

/// Elements [begin, end) of block `i` when `count` elements are split into `parts` blocks whose
/// sizes differ by at most one (the first count % parts blocks are one larger).
inline std::size_t block_begin(std::size_t count, std::size_t parts, std::size_t i) noexcept {
  const std::size_t q = count / parts, r = count % parts;
  return i * q + (i < r ? i : r);
}

}  // namespace dtrain::detail
