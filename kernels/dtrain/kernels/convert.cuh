// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device conversions between f32 and binary16 / bfloat16, round to nearest even. The
// element conversions are the DTRAIN_HOST_DEVICE functions of <dtrain/core/dtype.hpp>: host and
// device run one definition, so they agree bit for bit by construction (the GPU test still
// compares all 2^16 patterns and a million random f32 values).
#pragma once

#include <cstddef>
#include <cstdint>

#include <dtrain/core/dtype.hpp>
#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

/// Element conversions under their device-side names; they forward to the one definition in
/// <dtrain/core/dtype.hpp>.
DTRAIN_HOST_DEVICE inline std::uint16_t f32_to_f16_bits(float f) {
  return dtrain::detail::float_to_half_bits(f);
}
DTRAIN_HOST_DEVICE inline float f16_bits_to_f32(std::uint16_t h) {
  return dtrain::detail::half_bits_to_float(h);
}
DTRAIN_HOST_DEVICE inline std::uint16_t f32_to_bf16_bits(float f) {
  return dtrain::detail::float_to_bf16_bits(f);
}
DTRAIN_HOST_DEVICE inline float bf16_bits_to_f32(std::uint16_t b) {
  return dtrain::detail::bf16_bits_to_float(b);
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
void launch_map(const In* in, Out* out, std::size_t n, Op op, stream_t stream, const char* what) {
  if (!n) return;
  map4<<<blocks_for((n + 3) / 4, 256), 256, 0, stream>>>(in, out, n, op);
  check_launch(what);
}
}  // namespace kernels

/// Device array conversions: f32 narrows with round to nearest even, 16-bit types widen exactly.
/// Local, asynchronous on `stream`; device pointers owned by the caller.
inline void convert(const float* in, half* out, std::size_t n, stream_t stream = nullptr) {
  kernels::launch_map(in, reinterpret_cast<std::uint16_t*>(out), n, kernels::ToF16{}, stream,
                      "gpu::convert f32->f16");
}
inline void convert(const half* in, float* out, std::size_t n, stream_t stream = nullptr) {
  kernels::launch_map(reinterpret_cast<const std::uint16_t*>(in), out, n, kernels::FromF16{},
                      stream, "gpu::convert f16->f32");
}
inline void convert(const float* in, bfloat16* out, std::size_t n, stream_t stream = nullptr) {
  kernels::launch_map(in, reinterpret_cast<std::uint16_t*>(out), n, kernels::ToBf16{}, stream,
                      "gpu::convert f32->bf16");
}
inline void convert(const bfloat16* in, float* out, std::size_t n, stream_t stream = nullptr) {
  kernels::launch_map(reinterpret_cast<const std::uint16_t*>(in), out, n, kernels::FromBf16{},
                      stream, "gpu::convert bf16->f32");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain
