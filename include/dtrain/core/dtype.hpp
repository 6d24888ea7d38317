// SPDX-License-Identifier: BSD-3-Clause
// dtrain: element types, including IEEE binary16 (half) and bfloat16 with exact conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>

namespace dtrain {

/// Element types understood by tensors, collectives and checkpoints.
enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64 };

/// Size in bytes of one element. Local, pure.
constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

/// Short lower-case name ("f32", "bf16", ...). Local, pure.
constexpr const char* name_of(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

/// Parses a name produced by name_of; throws InvalidArgument otherwise.
inline DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64})
    if (s == name_of(t)) return t;
  raise<InvalidArgument>("dtype_from_name", "unknown dtype '" + s + "' (f32 f64 f16 bf16 i32 i64)");
}

constexpr bool is_floating(DType t) noexcept { return t != DType::i32 && t != DType::i64; }

namespace detail {

// The conversions below are DTRAIN_HOST_DEVICE: the device kernels (<dtrain/kernels/convert.cuh>)
// call these same definitions, so host and device round identically by construction.
// __builtin_memcpy is available in host and device code under GCC, Clang, nvcc and hipcc.
DTRAIN_HOST_DEVICE inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
DTRAIN_HOST_DEVICE inline float bits_float(std::uint32_t u) noexcept {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// binary32 -> binary16, round to nearest, ties to even; overflow gives infinity, NaN stays NaN
// (quiet, payload top bits kept), subnormal results are rounded correctly.
DTRAIN_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t man = x & 0x7fffffu;
  if (exp == 0xffu) {  // inf or NaN
    if (man == 0) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | (man >> 13));
  }
  const int e = static_cast<int>(exp) - 127 + 15;  // rebiased exponent
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    // Subnormal half (or zero). The value is man_full * 2^(exp-150); a half subnormal unit
    // is 2^-24, so the half mantissa is man_full >> (126 - exp), rounded.
    if (e < -10) return sign;  // below half of the smallest subnormal: rounds to zero
    man |= 0x800000u;          // implicit bit
    const int shift = 14 - e;  // 14..24
    std::uint32_t half_man = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_man & 1u))) ++half_man;
    return static_cast<std::uint16_t>(sign | half_man);  // carry into exponent is correct
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry to inf: correct
  return static_cast<std::uint16_t>(sign | h);
}

DTRAIN_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // Normalise the subnormal: value = man * 2^-24.
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return bits_float(sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | (man << 13));
  }
  return bits_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

// binary32 -> bfloat16 (upper half of binary32), round to nearest even; NaN kept quiet.
DTRAIN_HOST_DEVICE inline std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

DTRAIN_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16 storage type. Arithmetic goes through float; conversion from float rounds to
/// nearest even, conversion to float is exact. Trivially copyable, 2 bytes.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  DTRAIN_HOST_DEVICE explicit half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
  DTRAIN_HOST_DEVICE explicit operator float() const noexcept {
    return detail::half_bits_to_float(bits);
  }
  DTRAIN_HOST_DEVICE static half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 storage type (the top 16 bits of binary32). Same conventions as dtrain::half.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  DTRAIN_HOST_DEVICE explicit bfloat16(float f) noexcept : bits(detail::float_to_bf16_bits(f)) {}
  DTRAIN_HOST_DEVICE explicit operator float() const noexcept {
    return detail::bf16_bits_to_float(bits);
  }
  DTRAIN_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "16-bit types must be 2 bytes");

/// dtype_of<T>::value maps a C++ element type to its DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<DType, DType::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<DType, DType::f64> {};
template <>
struct dtype_of<half> : std::integral_constant<DType, DType::f16> {};
template <>
struct dtype_of<bfloat16> : std::integral_constant<DType, DType::bf16> {};
template <>
struct dtype_of<std::int32_t> : std::integral_constant<DType, DType::i32> {};
template <>
struct dtype_of<std::int64_t> : std::integral_constant<DType, DType::i64> {};

template <class T>
inline constexpr DType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

/// True for the C++ types that have a DType.
template <class T, class = void>
struct has_dtype : std::false_type {};
template <class T>
struct has_dtype<T, std::void_t<decltype(dtype_of<std::remove_cv_t<T>>::value)>> : std::true_type {
};
template <class T>
inline constexpr bool has_dtype_v = has_dtype<T>::value;

}  // namespace dtrain
