// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host element-wise reductions: the one reduction contract of dtrain, shared by the
// collectives (comm/) and, with the same semantics, by the device kernels (<dtrain/kernels/
// reduce.cuh>).
//
// The contract:
//  - Operand order: the accumulator comes first, the incoming operand second:
//    acc = acc (op) in. min keeps acc unless in < acc; max keeps acc unless acc < in.
//  - Integers: sum and prod wrap modulo 2^bits (computed in the unsigned type: no undefined
//    behaviour, and the same result in any reduction order). avg is the wrapped sum divided by the
//    number of ranks, truncated toward zero.
//  - 16-bit floats (f16, bf16) accumulate in f32 (accum_t): a reduction over many operands widens
//    each operand once (exactly), combines in f32 and rounds once, to nearest even, at the end
//    (narrow). The same-type form reduce_into(op, half* acc, const half* in, n) is one such
//    reduction of two operands: widen both, combine, round once.
//  - avg is finished once, on the accumulator, by scale_avg (f32 for 16-bit floats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>
#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/kernels/host/elementwise.hpp>

namespace dtrain {
namespace host {

/// True for the 16-bit float storage types.
template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// True for the 16-bit float dtypes (f16, bf16).
constexpr bool is_16bit_float(DType t) noexcept { return t == DType::f16 || t == DType::bf16; }

/// The type a reduction of T accumulates in: f32 for the 16-bit floats, T otherwise.
template <class T>
using accum_t = std::conditional_t<is_16bit_float_v<T>, float, T>;

namespace detail {
/// acc (op) in on accumulator values: the element operation of the contract, one definition for
/// the host and the device kernels.
template <class A>
DTRAIN_HOST_DEVICE inline A combine(ReduceOp op, A acc, A in) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return static_cast<A>(static_cast<U>(acc) + static_cast<U>(in));
      } else {
        return acc + in;
      }
    case ReduceOp::prod:
      if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return static_cast<A>(static_cast<U>(acc) * static_cast<U>(in));
      } else {
        return acc * in;
      }
    case ReduceOp::min: return in < acc ? in : acc;
    case ReduceOp::max: return acc < in ? in : acc;
  }
  return acc;
}
template <class T>
DTRAIN_HOST_DEVICE inline accum_t<T> widen1(T x) noexcept {
  return static_cast<accum_t<T>>(x);
}
}  // namespace detail

namespace detail {
template <ReduceOp Op>
using op_constant = std::integral_constant<ReduceOp, Op>;
// Calls f(op_constant<op>{}) with avg as sum: each element loop then sees one fixed operation,
// which the compiler vectorises. With the switch of combine() left inside the loop, GCC 12 at
// -O3 compiled the collectives' reductions to one element per iteration, testing the operation
// every time (benchmarks/RESULTS.md).
template <class F>
void with_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return f(op_constant<ReduceOp::sum>{});
    case ReduceOp::prod: return f(op_constant<ReduceOp::prod>{});
    case ReduceOp::min: return f(op_constant<ReduceOp::min>{});
    case ReduceOp::max: return f(op_constant<ReduceOp::max>{});
  }
}
}  // namespace detail

/// out[i] = a[i] (op) b[i] on accumulator types (f32, f64, i32, i64); `out` may alias `a` or `b`.
/// `avg` combines as sum (finish with scale_avg). Local.
template <class T, class = std::enable_if_t<!is_16bit_float_v<T>>>
void reduce(ReduceOp op, T* out, const T* a, const T* b, std::size_t n) noexcept {
  detail::with_op(op, [&](auto o) {
    detail::elementwise<T>(n, [&](std::size_t i) { out[i] = detail::combine<T>(o, a[i], b[i]); });
  });
}

/// acc[i] = acc[i] (op) in[i], both of type T. For 16-bit floats: widened, combined in f32,
/// rounded once. Local; acc and in must not overlap unless equal.
template <class T>
void reduce_into(ReduceOp op, T* acc, const T* in, std::size_t n) noexcept {
  detail::with_op(op, [&](auto o) {
    detail::elementwise<T>(n, [&](std::size_t i) {
      if constexpr (is_16bit_float_v<T>)
        acc[i] = T(detail::combine(o, detail::widen1(acc[i]), detail::widen1(in[i])));
      else
        acc[i] = detail::combine<T>(o, acc[i], in[i]);
    });
  });
}

/// acc[i] = acc[i] (op) widen(in[i]): a 16-bit float operand added into an f32 accumulator
/// without rounding (round once at the end with narrow). Local.
template <class T, class = std::enable_if_t<is_16bit_float_v<T>>>
void reduce_into(ReduceOp op, float* acc, const T* in, std::size_t n) noexcept {
  detail::with_op(op, [&](auto o) {
    detail::elementwise<float>(
        n, [&](std::size_t i) { acc[i] = detail::combine(o, acc[i], detail::widen1(in[i])); });
  });
}

/// out[i] = in[i] in the accumulator type (exact). Local.
template <class T>
void widen(const T* in, accum_t<T>* out, std::size_t n) noexcept {
  detail::elementwise<accum_t<T>>(n, [&](std::size_t i) { out[i] = detail::widen1(in[i]); });
}
/// out[i] = in[i] rounded to T, to nearest even (the one rounding of a 16-bit reduction). Local.
template <class T>
void narrow(const accum_t<T>* in, T* out, std::size_t n) noexcept {
  detail::elementwise<accum_t<T>>(n, [&](std::size_t i) { out[i] = T(in[i]); });
}

namespace detail {
/// x divided by `ranks`, as scale_avg finishes an avg.
template <class T>
inline T avg_of(T x, int ranks) noexcept {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(x / ranks);
  else
    return T(widen1(x) / static_cast<accum_t<T>>(ranks));
}
}  // namespace detail

/// Divides by `ranks` to finish an `avg`: integers truncate toward zero; floats divide in their
/// accumulator type (16-bit floats: widened, divided in f32, rounded once). Local.
template <class T>
void scale_avg(T* acc, std::size_t n, int ranks) noexcept {
  detail::elementwise<T>(n, [&](std::size_t i) { acc[i] = detail::avg_of(acc[i], ranks); });
}

/// out0[i] = out1[i] = a[i] (op) b[i], an avg finished over `ranks` as scale_avg does: the bits of
/// reduce then scale_avg then a copy, in one pass (accumulator types). out0 may alias a and out1
/// b, or the reverse. Local.
template <class T, class = std::enable_if_t<!is_16bit_float_v<T>>>
void reduce_store2(ReduceOp op, const T* a, const T* b, T* out0, T* out1, std::size_t n,
                   int ranks) noexcept {
  detail::with_op(op, [&](auto o) {
    if (op == ReduceOp::avg)
      detail::elementwise<T>(n, [&](std::size_t i) {
        const T v = detail::avg_of(detail::combine<T>(o, a[i], b[i]), ranks);
        out0[i] = v;
        out1[i] = v;
      });
    else
      detail::elementwise<T>(n, [&](std::size_t i) {
        const T v = detail::combine<T>(o, a[i], b[i]);
        out0[i] = v;
        out1[i] = v;
      });
  });
}

/// Untyped reduce for the collectives: `t` is an accumulator dtype (f32 f64 i32 i64; 16-bit floats
/// are widened before they reach the algorithms). Local; InvalidArgument for a 16-bit dtype.
inline void reduce(ReduceOp op, DType t, void* out, const void* a, const void* b, std::size_t n) {
  switch (t) {
    case DType::f32:
      return reduce(op, static_cast<float*>(out), static_cast<const float*>(a),
                    static_cast<const float*>(b), n);
    case DType::f64:
      return reduce(op, static_cast<double*>(out), static_cast<const double*>(a),
                    static_cast<const double*>(b), n);
    case DType::i32:
      return reduce(op, static_cast<std::int32_t*>(out), static_cast<const std::int32_t*>(a),
                    static_cast<const std::int32_t*>(b), n);
    case DType::i64:
      return reduce(op, static_cast<std::int64_t*>(out), static_cast<const std::int64_t*>(a),
                    static_cast<const std::int64_t*>(b), n);
    case DType::f16:
    case DType::bf16: break;
  }
  raise<InvalidArgument>("host::reduce",
                         dtrain::detail::concat(name_of(t), " accumulates in f32: widen it first"));
}

/// Untyped reduce_store2 for the collectives (accumulator dtypes, as the untyped reduce). Local.
inline void reduce_store2(ReduceOp op, DType t, const void* a, const void* b, void* out0,
                          void* out1, std::size_t n, int ranks) {
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduce_store2(op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out0),
                  static_cast<T*>(out1), n, ranks);
  };
  switch (t) {
    case DType::f32: return run(static_cast<float*>(nullptr));
    case DType::f64: return run(static_cast<double*>(nullptr));
    case DType::i32: return run(static_cast<std::int32_t*>(nullptr));
    case DType::i64: return run(static_cast<std::int64_t*>(nullptr));
    case DType::f16:
    case DType::bf16: break;
  }
  raise<InvalidArgument>("host::reduce_store2",
                         dtrain::detail::concat(name_of(t), " accumulates in f32: widen it first"));
}

/// Untyped scale_avg (any dtype). Local.
inline void scale_avg(DType t, void* data, std::size_t n, int ranks) noexcept {
  switch (t) {
    case DType::f32: return scale_avg(static_cast<float*>(data), n, ranks);
    case DType::f64: return scale_avg(static_cast<double*>(data), n, ranks);
    case DType::i32: return scale_avg(static_cast<std::int32_t*>(data), n, ranks);
    case DType::i64: return scale_avg(static_cast<std::int64_t*>(data), n, ranks);
    case DType::f16: return scale_avg(static_cast<half*>(data), n, ranks);
    case DType::bf16: return scale_avg(static_cast<bfloat16*>(data), n, ranks);
  }
}

/// Untyped widen of a 16-bit float array into f32. Local; InvalidArgument for other dtypes.
inline void widen(DType t, const void* in, float* out, std::size_t n) {
  if (t == DType::f16) return widen(static_cast<const half*>(in), out, n);
  if (t == DType::bf16) return widen(static_cast<const bfloat16*>(in), out, n);
  raise<InvalidArgument>("host::widen", dtrain::detail::concat(name_of(t), " is not 16-bit"));
}
/// Untyped narrow of f32 into a 16-bit float array. Local; InvalidArgument for other dtypes.
inline void narrow(DType t, const float* in, void* out, std::size_t n) {
  if (t == DType::f16) return narrow(in, static_cast<half*>(out), n);
  if (t == DType::bf16) return narrow(in, static_cast<bfloat16*>(out), n);
  raise<InvalidArgument>("host::narrow", dtrain::detail::concat(name_of(t), " is not 16-bit"));
}

/// reduce_into on untyped views: the same dtype and count, or an f32 accumulator and a 16-bit
/// float operand (widened into it without rounding). Local; throws InvalidArgument.
inline void reduce_into(ReduceOp op, BufferView acc, BufferView in) {
  const bool widening = acc.dtype == DType::f32 && is_16bit_float(in.dtype);
  DTRAIN_REQUIRE((acc.dtype == in.dtype || widening) && acc.count == in.count, "reduce_into",
                 "operands differ: " << name_of(acc.dtype) << "[" << acc.count << "] vs "
                                     << name_of(in.dtype) << "[" << in.count << "]");
  DTRAIN_REQUIRE(acc.space == Space::host && in.space == Space::host, "reduce_into",
                 "host kernel given " << name_of(acc.space) << " memory");
  if (widening) {
    if (in.dtype == DType::f16)
      return reduce_into(op, static_cast<float*>(acc.data), static_cast<const half*>(in.data),
                         acc.count);
    return reduce_into(op, static_cast<float*>(acc.data), static_cast<const bfloat16*>(in.data),
                       acc.count);
  }
  switch (acc.dtype) {
    case DType::f32:
      return reduce_into(op, static_cast<float*>(acc.data), static_cast<const float*>(in.data),
                         acc.count);
    case DType::f64:
      return reduce_into(op, static_cast<double*>(acc.data), static_cast<const double*>(in.data),
                         acc.count);
    case DType::f16:
      return reduce_into(op, static_cast<half*>(acc.data), static_cast<const half*>(in.data),
                         acc.count);
    case DType::bf16:
      return reduce_into(op, static_cast<bfloat16*>(acc.data),
                         static_cast<const bfloat16*>(in.data), acc.count);
    case DType::i32:
      return reduce_into(op, static_cast<std::int32_t*>(acc.data),
                         static_cast<const std::int32_t*>(in.data), acc.count);
    case DType::i64:
      return reduce_into(op, static_cast<std::int64_t*>(acc.data),
                         static_cast<const std::int64_t*>(in.data), acc.count);
  }
}

/// out = in converted between a 16-bit float type and f32 (same count): widened exactly, or
/// rounded once to nearest even. Local; throws InvalidArgument for other pairs.
inline void convert_into(BufferView out, BufferView in) {
  DTRAIN_REQUIRE(out.count == in.count && out.space == Space::host && in.space == Space::host,
                 "convert_into",
                 name_of(in.dtype) << "[" << in.count << "] in " << name_of(in.space)
                                   << " memory to " << name_of(out.dtype) << "[" << out.count
                                   << "] in " << name_of(out.space) << " memory");
  if (out.dtype == DType::f32 && is_16bit_float(in.dtype))
    return widen(in.dtype, in.data, static_cast<float*>(out.data), in.count);
  if (in.dtype == DType::f32 && is_16bit_float(out.dtype))
    return narrow(out.dtype, static_cast<const float*>(in.data), out.data, in.count);
  raise<InvalidArgument>("convert_into",
                         dtrain::detail::concat(name_of(in.dtype), " to ", name_of(out.dtype),
                                                ": converts 16-bit floats and f32"));
}

}  // namespace host
}  // namespace dtrain
