// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device element-wise reductions with the contract of <dtrain/kernels/host/reduce.hpp>:
// accumulator first (acc = acc op in), integers wrap (unsigned arithmetic), 16-bit floats
// accumulate in f32 and round once, avg finished once by scale_avg. The element operation is the
// host's own DTRAIN_HOST_DEVICE host::detail::combine, so host and device agree bit for bit by
// construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/kernels/convert.cuh>
#include <dtrain/kernels/gpu.hpp>
#include <dtrain/kernels/host/reduce.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
// Storage <-> accumulator type. The 16-bit types travel as their bits.
template <class T>
struct Lane {
  using storage = T;
  using arith = T;
  __device__ static arith load(storage s) { return s; }
  __device__ static storage store(arith a) { return a; }
};
template <>
struct Lane<half> {
  using storage = std::uint16_t;
  using arith = float;
  __device__ static arith load(storage s) { return f16_bits_to_f32(s); }
  __device__ static storage store(arith a) { return f32_to_f16_bits(a); }
};
template <>
struct Lane<bfloat16> {
  using storage = std::uint16_t;
  using arith = float;
  __device__ static arith load(storage s) { return bf16_bits_to_f32(s); }
  __device__ static storage store(arith a) { return f32_to_bf16_bits(a); }
};

// acc and in of the same type (one rounding per element for 16-bit floats).
template <class T>
__global__ void reduce_into(ReduceOp op, typename Lane<T>::storage* acc,
                            const typename Lane<T>::storage* in, std::size_t n) {
  using L = Lane<T>;
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    acc[i] = L::store(host::detail::combine(op, L::load(acc[i]), L::load(in[i])));
}
// A 16-bit operand into an f32 accumulator (no rounding).
template <class T>
__global__ void accumulate(ReduceOp op, float* __restrict__ acc,
                           const typename Lane<T>::storage* __restrict__ in, std::size_t n) {
  using L = Lane<T>;
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    acc[i] = host::detail::combine(op, acc[i], L::load(in[i]));
}
template <class T>
__global__ void widen(const typename Lane<T>::storage* __restrict__ in,
                      typename Lane<T>::arith* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = Lane<T>::load(in[i]);
}
template <class T>
__global__ void narrow(const typename Lane<T>::arith* __restrict__ in,
                       typename Lane<T>::storage* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = Lane<T>::store(in[i]);
}
template <class T>
__global__ void scale_avg(typename Lane<T>::storage* acc, std::size_t n, int ranks) {
  using L = Lane<T>;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    if constexpr (std::is_integral_v<T>)
      acc[i] = static_cast<T>(acc[i] / ranks);
    else
      acc[i] = L::store(L::load(acc[i]) / static_cast<typename L::arith>(ranks));
  }
}
}  // namespace kernels

/// acc[i] = acc[i] (op) in[i] on device arrays of one type (16-bit floats: widened, combined in
/// f32, rounded once); `avg` combines as sum. Asynchronous on `stream`.
template <class T>
void reduce_into(ReduceOp op, T* acc, const T* in, std::size_t n, stream_t stream = nullptr) {
  using S = typename kernels::Lane<T>::storage;
  if (!n) return;
  kernels::reduce_into<T><<<blocks_for(n, 256), 256, 0, stream>>>(
      op, reinterpret_cast<S*>(acc), reinterpret_cast<const S*>(in), n);
  check_launch("gpu::reduce_into");
}

/// acc[i] = acc[i] (op) widen(in[i]): a 16-bit float operand into an f32 accumulator without
/// rounding (round once at the end with narrow). Asynchronous.
template <class T, class = std::enable_if_t<host::is_16bit_float_v<T>>>
void reduce_into(ReduceOp op, float* acc, const T* in, std::size_t n, stream_t stream = nullptr) {
  using S = typename kernels::Lane<T>::storage;
  if (!n) return;
  kernels::accumulate<T>
      <<<blocks_for(n, 256), 256, 0, stream>>>(op, acc, reinterpret_cast<const S*>(in), n);
  check_launch("gpu::reduce_into");
}

/// out[i] = in[i] in the accumulator type (exact). Asynchronous.
template <class T>
void widen(const T* in, host::accum_t<T>* out, std::size_t n, stream_t stream = nullptr) {
  using S = typename kernels::Lane<T>::storage;
  if (!n) return;
  kernels::widen<T><<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<const S*>(in), out, n);
  check_launch("gpu::widen");
}
/// out[i] = in[i] rounded to T, to nearest even. Asynchronous.
template <class T>
void narrow(const host::accum_t<T>* in, T* out, std::size_t n, stream_t stream = nullptr) {
  using S = typename kernels::Lane<T>::storage;
  if (!n) return;
  kernels::narrow<T><<<blocks_for(n, 256), 256, 0, stream>>>(in, reinterpret_cast<S*>(out), n);
  check_launch("gpu::narrow");
}

/// Divides by `ranks` to finish an avg (integers truncate toward zero). Asynchronous.
template <class T>
void scale_avg(T* acc, std::size_t n, int ranks, stream_t stream = nullptr) {
  using S = typename kernels::Lane<T>::storage;
  if (!n) return;
  kernels::scale_avg<T>
      <<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<S*>(acc), n, ranks);
  check_launch("gpu::scale_avg");
}

/// Untyped form for collectives: the same dtype and count, or an f32 accumulator and a 16-bit
/// float operand (widened into it without rounding); memory must be this dialect's device
/// memory. Throws InvalidArgument otherwise.
inline void reduce_into(ReduceOp op, BufferView acc, BufferView in, stream_t stream = nullptr) {
  const bool widening = acc.dtype == DType::f32 && host::is_16bit_float(in.dtype);
  DTRAIN_REQUIRE((acc.dtype == in.dtype || widening) && acc.count == in.count, "gpu::reduce_into",
                 "operands differ: " << name_of(acc.dtype) << "[" << acc.count << "] vs "
                                     << name_of(in.dtype) << "[" << in.count << "]");
  DTRAIN_REQUIRE(
      acc.space == gpu::space && in.space == gpu::space, "gpu::reduce_into",
      "device kernel given " << name_of(acc.space) << " / " << name_of(in.space) << " memory");
  if (widening) {
    if (in.dtype == DType::f16)
      return reduce_into(op, static_cast<float*>(acc.data), static_cast<const half*>(in.data),
                         acc.count, stream);
    return reduce_into(op, static_cast<float*>(acc.data), static_cast<const bfloat16*>(in.data),
                       acc.count, stream);
  }
  switch (acc.dtype) {
    case DType::f32:
      return reduce_into(op, static_cast<float*>(acc.data), static_cast<const float*>(in.data),
                         acc.count, stream);
    case DType::f64:
      return reduce_into(op, static_cast<double*>(acc.data), static_cast<const double*>(in.data),
                         acc.count, stream);
    case DType::f16:
      return reduce_into(op, static_cast<half*>(acc.data), static_cast<const half*>(in.data),
                         acc.count, stream);
    case DType::bf16:
      return reduce_into(op, static_cast<bfloat16*>(acc.data),
                         static_cast<const bfloat16*>(in.data), acc.count, stream);
    case DType::i32:
      return reduce_into(op, static_cast<std::int32_t*>(acc.data),
                         static_cast<const std::int32_t*>(in.data), acc.count, stream);
    case DType::i64:
      return reduce_into(op, static_cast<std::int64_t*>(acc.data),
                         static_cast<const std::int64_t*>(in.data), acc.count, stream);
  }
}

/// out = in converted between a 16-bit float type and f32 (same count): widened exactly, or
/// rounded once to nearest even; device memory of this dialect. Asynchronous; throws
/// InvalidArgument for other pairs.
inline void convert_into(BufferView out, BufferView in, stream_t stream = nullptr) {
  DTRAIN_REQUIRE(out.count == in.count && out.space == gpu::space && in.space == gpu::space,
                 "gpu::convert_into",
                 name_of(in.dtype) << "[" << in.count << "] in " << name_of(in.space)
                                   << " memory to " << name_of(out.dtype) << "[" << out.count
                                   << "] in " << name_of(out.space) << " memory");
  if (out.dtype == DType::f32 && in.dtype == DType::f16)
    return widen(static_cast<const half*>(in.data), static_cast<float*>(out.data), in.count,
                 stream);
  if (out.dtype == DType::f32 && in.dtype == DType::bf16)
    return widen(static_cast<const bfloat16*>(in.data), static_cast<float*>(out.data), in.count,
                 stream);
  if (in.dtype == DType::f32 && out.dtype == DType::f16)
    return narrow(static_cast<const float*>(in.data), static_cast<half*>(out.data), in.count,
                  stream);
  if (in.dtype == DType::f32 && out.dtype == DType::bf16)
    return narrow(static_cast<const float*>(in.data), static_cast<bfloat16*>(out.data), in.count,
                  stream);
  DTRAIN_REQUIRE(false, "gpu::convert_into",
                 name_of(in.dtype)
                     << " to " << name_of(out.dtype) << ": converts 16-bit floats and f32");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain
