// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what a transport can do beyond the requirements, detected rather than declared.
//
// Optional members (a transport without them gets the default named):
//   static constexpr bool supports_device_memory;  device pointers accepted   (default false)
//   static constexpr bool requires_registration;   plans register every buffer (default false)
//   static constexpr bool one_sided;               one-sided underneath       (default false)
//   static constexpr bool thread_safe;             a second thread may drive it (default true)
//   TransportCapabilities capabilities() const;    the same as run-time values; wins over the
//                                                  flags (AnyTransport has it)
//   bool allows_progress_thread() const;           run-time answer for the progress thread
//                                                  (default: thread_safe)
//   DeviceBuffers device_buffers(Space) const;     run-time answer: whether isend/irecv take
//                                                  buffers of that device space as they are, and
//                                                  why (default: supports_device_memory)
// A transport_capabilities specialisation may state the flags instead of the transport.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/core/detect.hpp>
#include <dtrain/core/space.hpp>

namespace dtrain {
namespace detail {

// T itself where `Declared`, the declared type of one of its members, is const bool: a flag is
// read only from a `static constexpr bool` member (a non-static member or a constant of another
// type is no flag). Substitution goes left to right and stops at the first failure, so the
// flag aliases below never name the member's value when its type is wrong.
template <class T, class Declared>
using flag_owner = std::enable_if_t<std::is_same_v<Declared, const bool>, T>;

// Each flag as a std::bool_constant.
template <class T>
using device_memory_flag =
    std::bool_constant<flag_owner<T, decltype(T::supports_device_memory)>::supports_device_memory>;
template <class T>
using registration_flag =
    std::bool_constant<flag_owner<T, decltype(T::requires_registration)>::requires_registration>;
template <class T>
using one_sided_flag = std::bool_constant<flag_owner<T, decltype(T::one_sided)>::one_sided>;
template <class T>
using thread_safe_flag = std::bool_constant<flag_owner<T, decltype(T::thread_safe)>::thread_safe>;

}  // namespace detail

/// Capabilities of a transport, known at compile time. The primary template reads the
/// transport's own `static constexpr bool` members of these names (absent: the default shown);
/// a specialisation may state them instead. The communicator consults them through
/// capabilities_of (below), which also sees a run-time answer where the transport gives one.
template <class T, class = void>
struct transport_capabilities {
  /// isend/irecv/bind accept device pointers (GPU-aware MPI, GPUDirect RDMA). Without it the
  /// communicator refuses device buffers.
  static constexpr bool supports_device_memory =
      detail::detected_or_t<std::false_type, detail::device_memory_flag, T>::value;
  /// Every buffer passed to isend/irecv/bind must lie inside a region from register_memory: the
  /// plan then registers every buffer it sends from or receives into (the caller's and its
  /// scratch) and uses the returned regions. Without it (and without one_sided) the plan calls
  /// no register_memory.
  static constexpr bool requires_registration =
      detail::detected_or_t<std::false_type, detail::registration_flag, T>::value;
  /// The transport is one-sided underneath and benefits from plans that replay one pattern:
  /// plans register their buffers with it as with requires_registration.
  static constexpr bool one_sided =
      detail::detected_or_t<std::false_type, detail::one_sided_flag, T>::value;
  /// A second thread may drive this transport while the owner thread waits on a queue (needed
  /// for the communicator's progress thread). Transports decide at run time via
  /// `bool allows_progress_thread() const` when they have it.
  static constexpr bool thread_safe =
      detail::detected_or_t<std::true_type, detail::thread_safe_flag, T>::value;
};

/// The same capabilities as run-time values (AnyTransport reports its wrapped transport's).
struct TransportCapabilities {
  bool supports_device_memory = false;
  bool requires_registration = false;
  bool one_sided = false;
  bool thread_safe = true;
};

namespace detail {
template <class T>
using capabilities_call = decltype(std::declval<const T&>().capabilities());
template <class T>
using progress_query_call = decltype(bool{std::declval<const T&>().allows_progress_thread()});

template <class T>
using has_runtime_capabilities = is_detected_exact<TransportCapabilities, capabilities_call, T>;
template <class T>
using has_progress_query = is_detected<progress_query_call, T>;
}  // namespace detail

/// T's capabilities: its run-time answer where it has one, else transport_capabilities<T>.
template <class T>
TransportCapabilities capabilities_of(const T& t) {
  if constexpr (detail::has_runtime_capabilities<T>::value) {
    return t.capabilities();
  } else {
    using C = transport_capabilities<T>;
    return TransportCapabilities{C::supports_device_memory, C::requires_registration, C::one_sided,
                                 C::thread_safe};
  }
}

/// Whether a transport's isend/irecv take buffers of one device space as they are (hand-over)
/// or the caller must stage them through host memory, and why (for the log and errors).
struct DeviceBuffers {
  bool handed_over = false;
  std::string why;
};

namespace detail {
template <class T>
using device_buffers_call = decltype(std::declval<const T&>().device_buffers(Space::cuda));
template <class T>
using has_device_buffers_query = is_detected_exact<DeviceBuffers, device_buffers_call, T>;
}  // namespace detail

/// Local: whether `t` takes buffers of device space `space` as they are: its run-time answer
/// (`DeviceBuffers device_buffers(Space) const`, e.g. MpiTransport asking the MPI library) where
/// it has one, else its supports_device_memory capability. Host memory is always taken.
template <class T>
DeviceBuffers device_buffers_of(const T& t, Space space) {
  if (space == Space::host) return {true, "host memory"};
  if constexpr (detail::has_device_buffers_query<T>::value) {
    return t.device_buffers(space);
  } else {
    if (capabilities_of(t).supports_device_memory)
      return {true, "the transport takes device memory (supports_device_memory)"};
    return {false, "the transport does not take device memory (supports_device_memory is false)"};
  }
}

namespace detail {
/// Whether a progress thread may drive transport `t` (a run-time answer where T offers one).
template <class T>
bool transport_allows_progress_thread(const T& t) {
  if constexpr (has_progress_query<T>::value)
    return t.allows_progress_thread();
  else
    return transport_capabilities<T>::thread_safe;
}
}  // namespace detail

}  // namespace dtrain
