// dtrain: device conversions between f32 and binary16 / bfloat16, round to nearest even, bit-exact
// with the host conversions in <dtrain/core/dtype.hpp> (the tests compare all 2^16 patterns and
// random f32 values).
#pragma once

#include <cstddef>
#include <cstdint>

#include <dtrain/core/dtype.hpp>
#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {

__device__ inline std::uint32_t f32_bits(float f) { return __float_as_uint(f); }
__device__ inline float bits_f32(std::uint32_t u) { return __uint_as_float(u); }

/// binary32 -> binary16 bits (round to nearest even; overflow to inf; NaN stays quiet NaN).
__device__ inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = f32_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t man = x & 0x7fffffu;
  if (exp == 0xffu)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
  const int e = static_cast<int>(exp) - 112;  // rebias 127 -> 15
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 bits -> binary32 (exact).
__device__ inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    // man * 2^-24, exact in float arithmetic.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/// binary32 -> bfloat16 bits (round to nearest even; NaN stays quiet NaN).
__device__ inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
__device__ inline float bf16_bits_to_f32(std::uint16_t b) {
  return bits_f32(static_cast<std::uint32_t>(b) << 16);
}

namespace kernels {
struct ToF16 {
  __device__ std::uint16_t operator()(float x) const { return f32_to_f16_bits(x); }
};
struct FromF16 {
  __device__ float operator()(std::uint16_t x) const { return f16_bits_to_f32(x); }
};
struct ToBf16 {
  __device__ std::uint16_t operator()(float x) const { return f32_to_bf16_bits(x); }
};
struct FromBf16 {
  __device__ float operator()(std::uint16_t x) const { return bf16_bits_to_f32(x); }
};
template <class In, class Out, class Op>
__global__ void map(const In* __restrict__ in, Out* __restrict__ out, std::size_t n, Op op) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = op(in[i]);
}
}  // namespace kernels

/// Device array conversions (asynchronous on `stream`; device pointers).
inline void convert(const float* in, half* out, std::size_t n, stream_t stream = nullptr) {
  if (!n) return;
  kernels::map<<<blocks_for(n, 256), 256, 0, stream>>>(in, reinterpret_cast<std::uint16_t*>(out), n,
                                                       kernels::ToF16{});
  check_launch("gpu::convert f32->f16");
}
inline void convert(const half* in, float* out, std::size_t n, stream_t stream = nullptr) {
  if (!n) return;
  kernels::map<<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<const std::uint16_t*>(in),
                                                       out, n, kernels::FromF16{});
  check_launch("gpu::convert f16->f32");
}
inline void convert(const float* in, bfloat16* out, std::size_t n, stream_t stream = nullptr) {
  if (!n) return;
  kernels::map<<<blocks_for(n, 256), 256, 0, stream>>>(in, reinterpret_cast<std::uint16_t*>(out), n,
                                                       kernels::ToBf16{});
  check_launch("gpu::convert f32->bf16");
}
inline void convert(const bfloat16* in, float* out, std::size_t n, stream_t stream = nullptr) {
  if (!n) return;
  kernels::map<<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<const std::uint16_t*>(in),
                                                       out, n, kernels::FromBf16{});
  check_launch("gpu::convert bf16->f32");
}

}  // namespace gpu
}  // namespace dtrain
