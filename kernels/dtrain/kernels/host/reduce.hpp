// dtrain: host elementwise reductions for collectives on host buffers of any dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain {
namespace host {

namespace detail {
template <class T>
struct Arith {  // 16-bit floats reduce in float and round once per combine
  using type = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;
};
template <class T>
inline typename Arith<T>::type widen(T x) noexcept {
  return static_cast<typename Arith<T>::type>(x);
}
template <class T, class A>
inline T narrow(A x) noexcept {
  return T(x);
}
}  // namespace detail

/// acc[i] = acc[i] (op) in[i] for sum, prod, min and max; `avg` combines as sum (finish with
/// scale_avg). Local; acc and in must not overlap.
template <class T>
void reduce_into(ReduceOp op, T* acc, const T* in, std::size_t n) {
  using detail::narrow;
  using detail::widen;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < n; ++i) acc[i] = narrow<T>(widen(acc[i]) + widen(in[i]));
      return;
    case ReduceOp::prod:
      for (std::size_t i = 0; i < n; ++i) acc[i] = narrow<T>(widen(acc[i]) * widen(in[i]));
      return;
    case ReduceOp::min:
      for (std::size_t i = 0; i < n; ++i) acc[i] = widen(in[i]) < widen(acc[i]) ? in[i] : acc[i];
      return;
    case ReduceOp::max:
      for (std::size_t i = 0; i < n; ++i) acc[i] = widen(in[i]) > widen(acc[i]) ? in[i] : acc[i];
      return;
  }
}

/// Divides by `ranks` to finish an `avg` (integers truncate toward zero). Local.
template <class T>
void scale_avg(T* acc, std::size_t n, int ranks) {
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>)
      acc[i] = static_cast<T>(acc[i] / ranks);
    else
      acc[i] = detail::narrow<T>(detail::widen(acc[i]) / static_cast<float>(ranks));
  }
}

/// reduce_into on untyped views (same dtype and count required). Local; throws InvalidArgument.
inline void reduce_into(ReduceOp op, BufferView acc, BufferView in) {
  DTRAIN_REQUIRE(acc.dtype == in.dtype && acc.count == in.count, "reduce_into",
                 "operands differ: " << name_of(acc.dtype) << "[" << acc.count << "] vs "
                                     << name_of(in.dtype) << "[" << in.count << "]");
  DTRAIN_REQUIRE(acc.space == Space::host && in.space == Space::host, "reduce_into",
                 "host kernel given " << name_of(acc.space) << " memory");
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

}  // namespace host
}  // namespace dtrain
