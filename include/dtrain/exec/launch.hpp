// SPDX-License-Identifier: BSD-3-Clause
// dtrain: how a layer's own kernels run on whatever execution policy the model uses, so that a
// new layer (built-in or the user's) brings its kernels with it instead of adding members to
// every policy.
//
// Two ways, both in stream order on the stream the layer is given:
//   - Host code: a policy whose kernels run on the host (HostExec, the emulated device of the
//     tests) has `host_kernel(stream, name, f, args...)`, which runs f(args...) in stream order:
//     a layer calls `this->exec().host_kernel(s, "name", f, args...)` under
//     `if constexpr (runs_host_kernels_v<Exec>)`, never the host function directly (a policy
//     with streams of its own runs it in their order).
//     Pointer arguments are exec memory and are passed as direct arguments (a policy that maps
//     device memory elsewhere translates them); never hide them inside a struct.
//   - Device code: on a GPU policy (runs_host_kernels_v is false) `stream_type` is the native
//     cudaStream_t / hipStream_t, so a layer launches its own `__global__` function with
//     `kernel<<<blocks, threads, 0, stream>>>(...)` in a DTRAIN_DEVICE_CODE section.
// for_each_index covers the common element-wise case from one source: a functor with a
// DTRAIN_HOST_DEVICE `operator()(std::int64_t i)` runs as a host loop or as a grid-stride device
// kernel, whichever the policy needs. A policy for another back end (or the emulated GPU of the
// tests) may run such functors itself with a member `for_each_index<F>(stream, name, n, args...)`.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <dtrain/core/host_device.hpp>

/// True in a translation unit compiled by nvcc or hipcc: where a layer's `__global__` functions
/// and `<<<...>>>` launches may appear.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define DTRAIN_DEVICE_CODE 1
#else
#define DTRAIN_DEVICE_CODE 0
#endif

namespace dtrain {

namespace detail {
struct NoKernel {
  void operator()() const noexcept {}
};
template <class E, class = void>
struct runs_host_kernels : std::false_type {};
template <class E>
struct runs_host_kernels<E, std::void_t<decltype(std::declval<E&>().host_kernel(
                                std::declval<typename E::stream_type>(), "", NoKernel{}))>>
    : std::true_type {};
template <class>
inline constexpr bool always_false = false;
template <class E, class F, class Args, class = void>
struct runs_functors : std::false_type {};
template <class E, class F, class... A>
struct runs_functors<
    E, F, void(A...),
    std::void_t<decltype(std::declval<E&>().template for_each_index<F>(
        std::declval<typename E::stream_type>(), "", std::int64_t{}, std::declval<A>()...))>>
    : std::true_type {};
}  // namespace detail

/// True when policy E runs host code in stream order (E::host_kernel); false for device policies,
/// whose layers launch device kernels on E::stream_type.
template <class E>
inline constexpr bool runs_host_kernels_v = detail::runs_host_kernels<E>::value;

namespace detail {
// Defined by <dtrain/kernels/for_each.cuh> (nvcc / hipcc only): the grid-stride launch.
template <class F, class S, class... A>
void device_for_each(S stream, std::int64_t n, A... args);
}  // namespace detail

/// Runs F{args...}(i) for every i in [0, n) in stream order on `stream` of `exec`: a host loop on
/// host-running policies, a grid-stride kernel on a device policy (then F's operator() must be
/// DTRAIN_HOST_DEVICE and the unit compiled by nvcc or hipcc). F is an aggregate built from
/// `args` (exec pointers and values) where it runs; iterations must be independent. `name` names
/// the kernel in errors. Local, non-blocking on device policies.
template <class F, class Exec, class... A>
void for_each_index(Exec& exec, typename Exec::stream_type stream, const char* name, std::int64_t n,
                    A... args) {
  if (n <= 0) return;
  if constexpr (runs_host_kernels_v<Exec>) {
    exec.host_kernel(
        stream, name,
        [](std::int64_t count, auto... a) {
          const F f{a...};
          for (std::int64_t i = 0; i < count; ++i) f(i);
        },
        n, args...);
  } else if constexpr (detail::runs_functors<Exec, F, void(A...)>::value) {
    exec.template for_each_index<F>(stream, name, n, args...);
  } else {
#if DTRAIN_DEVICE_CODE
    detail::device_for_each<F>(stream, n, args...);
#else
    static_assert(detail::always_false<Exec>,
                  "for_each_index on a device policy needs a unit compiled by nvcc or hipcc");
#endif
  }
}

}  // namespace dtrain

#if DTRAIN_DEVICE_CODE
#include <dtrain/kernels/for_each.cuh>
#endif
