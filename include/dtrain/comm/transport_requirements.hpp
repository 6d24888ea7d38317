// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what every transport must provide, checked at compile time.
//
// A transport moves bytes between the ranks of one fixed group. The collective algorithms
// (<dtrain/comm/communicator.hpp>) are written once against this vocabulary:
//   using Request = ...;                       default-constructible handle of one operation;
//                                              it must not move while the operation is active
//   int rank() const;  int size() const;
//   void isend(Request&, int peer, int tag, const void* data, std::size_t bytes);
//   void irecv(Request&, int peer, int tag, void* data, std::size_t bytes);
//   bool test(Request&);                       non-blocking; true once complete
//   bool wait_until(Request&, const Deadline&) blocking; false when the deadline passed first
//   void cancel(Request&) noexcept;            abandons an active operation (error paths)
//   register_memory / deregister_memory        see transport_registration.hpp
//
// Messages between one (sender, receiver, tag) triple match in the order they were posted, and a
// receive names the exact byte count the matching send carries. Ranks never post a send to
// themselves. Sends may complete before the receiver posts (buffered) or only once matched
// (rendezvous): the algorithms never depend on either.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include <dtrain/comm/transport_registration.hpp>
#include <dtrain/core/detect.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain {
namespace detail {

template <class T>
using request_type = typename T::Request;
// Braced: a rank or size that only narrows to int is not one.
template <class T>
using rank_call = decltype(int{std::declval<const T&>().rank()});
template <class T>
using size_call = decltype(int{std::declval<const T&>().size()});
template <class T>
using isend_call = decltype(std::declval<T&>().isend(
    std::declval<typename T::Request&>(), 0, 0, static_cast<const void*>(nullptr), std::size_t{}));
template <class T>
using irecv_call = decltype(std::declval<T&>().irecv(std::declval<typename T::Request&>(), 0, 0,
                                                     static_cast<void*>(nullptr), std::size_t{}));
template <class T>
using test_call = decltype(std::declval<T&>().test(std::declval<typename T::Request&>()));
template <class T>
using wait_until_call = decltype(std::declval<T&>().wait_until(std::declval<typename T::Request&>(),
                                                               std::declval<const Deadline&>()));
template <class T>
using cancel_call = decltype(std::declval<T&>().cancel(std::declval<typename T::Request&>()));

template <class T>
using has_request_type = is_detected<request_type, T>;
template <class T>
using has_rank_size = std::conjunction<is_detected<rank_call, T>, is_detected<size_call, T>>;
template <class T>
using has_isend = is_detected<isend_call, T>;
template <class T>
using has_irecv = is_detected<irecv_call, T>;
template <class T>
using has_test = is_detected_exact<bool, test_call, T>;
template <class T>
using has_wait_until = is_detected_exact<bool, wait_until_call, T>;
template <class T>
using has_cancel = is_detected<cancel_call, T>;

}  // namespace detail

/// True when T provides every member the collectives need (see the top of this header and
/// transport_registration.hpp).
template <class T>
inline constexpr bool is_transport_v =
    std::conjunction_v<detail::has_request_type<T>, detail::has_rank_size<T>, detail::has_isend<T>,
                       detail::has_irecv<T>, detail::has_test<T>, detail::has_wait_until<T>,
                       detail::has_cancel<T>, detail::has_registration<T>>;

namespace detail {
/// Fires one static_assert per missing member so the compiler names what is wrong.
template <class T>
constexpr bool check_transport() {
  static_assert(has_request_type<T>::value, "dtrain transport: missing nested type `Request`");
  static_assert(has_rank_size<T>::value,
                "dtrain transport: missing `int rank() const` / `int size() const`");
  static_assert(has_isend<T>::value,
                "dtrain transport: missing `void isend(Request&, int peer, int tag, const void*, "
                "std::size_t)`");
  static_assert(has_irecv<T>::value,
                "dtrain transport: missing `void irecv(Request&, int peer, int tag, void*, "
                "std::size_t)`");
  static_assert(has_test<T>::value, "dtrain transport: missing `bool test(Request&)`");
  static_assert(has_wait_until<T>::value,
                "dtrain transport: missing `bool wait_until(Request&, const Deadline&)`");
  static_assert(has_cancel<T>::value, "dtrain transport: missing `void cancel(Request&) noexcept`");
  static_assert(has_registration<T>::value,
                "dtrain transport: missing `MemoryRegion register_memory(void*, std::size_t, "
                "Space)` / `void deregister_memory(MemoryRegion&)`");
  return true;
}
}  // namespace detail

}  // namespace dtrain
