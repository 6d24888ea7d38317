// SPDX-License-Identifier: BSD-3-Clause
// dtrain: persistent, plan-scoped channels, an optional transport capability.
//
// Detected members (fallback without them: isend/irecv with tag channel_tag(id)):
//   using Channel = ...;                     default-constructible, movable while unbound
//   Channel bind_send(int peer, int channel_id, const MemoryRegion& region,
//                     std::size_t offset, std::size_t bytes);
//   Channel bind_recv(int peer, int channel_id, const MemoryRegion& region,
//                     std::size_t offset, std::size_t bytes);
//   void start(Request&, Channel&);          posts the bound operation once; complete it with
//                                            test / wait_until, abandon it with cancel
//   void unbind(Channel&) noexcept;          at plan destruction (the channel is not active)
//   bool supports_channels() const;          optional run-time answer (default: true)
// A plan binds every message it will ever send or receive at construction (local: no
// communication), then starts the same channels, in the same order, on every execution. The
// channel id is the same on both ends of a message and stable across executions (it comes from
// the algorithm's schedule, never from a sequence number); ids are non-negative ints, unique per
// (sender, receiver) within one plan, and ids below 32 are the fingerprint exchange's (the same
// in every plan). `region` is what register_memory returned for the buffer holding the message,
// `offset` the message's position in it. A send is only started once the receiver's matching
// channel may have been started too (the algorithms never depend on it being started first).
// Channels of different plans with the same (peer, id) are never active at the same time.
//
// One-sided, pre-registered transports (RDMA) implement the channels: at bind time they know the
// peer, the registered region and the exact bytes of every message the plan will ever move, so
// they can exchange remote addresses and keys once (on a channel's first start) and afterwards
// turn each start of a send channel into one remote write with notification into the peer's
// already known receive buffer.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include <dtrain/comm/transport_registration.hpp>
#include <dtrain/core/detect.hpp>

namespace dtrain {
namespace detail {

template <class T>
using channel_type = typename T::Channel;
template <class T>
using bind_send_call = decltype(std::declval<T&>().bind_send(
    0, 0, std::declval<const MemoryRegion&>(), std::size_t{}, std::size_t{}));
template <class T>
using bind_recv_call = decltype(std::declval<T&>().bind_recv(
    0, 0, std::declval<const MemoryRegion&>(), std::size_t{}, std::size_t{}));
template <class T>
using start_call = decltype(std::declval<T&>().start(std::declval<typename T::Request&>(),
                                                     std::declval<typename T::Channel&>()));
template <class T>
using unbind_call = decltype(std::declval<T&>().unbind(std::declval<typename T::Channel&>()));
template <class T>
using channel_query_call = decltype(bool{std::declval<const T&>().supports_channels()});

/// Whether T has channels as above (both binds return its Channel).
template <class T>
using has_channels =
    std::conjunction<is_detected<channel_type, T>,
                     is_detected_exact<detected_t<channel_type, T>, bind_send_call, T>,
                     is_detected_exact<detected_t<channel_type, T>, bind_recv_call, T>,
                     is_detected<start_call, T>, is_detected<unbind_call, T>>;
template <class T>
using has_channel_query = is_detected<channel_query_call, T>;

/// The channel handle of T, or an empty placeholder for transports without channels.
struct NoChannel {};
template <class T>
struct channel_type_of {
  using type = std::conditional_t<has_channels<T>::value, detected_t<channel_type, T>, NoChannel>;
};

}  // namespace detail

/// Whether plans over `t` bind persistent channels (T has them and, where it answers at run
/// time, says yes).
template <class T>
bool channels_available(const T& t) {
  if constexpr (!detail::has_channels<T>::value)
    return false;
  else if constexpr (detail::has_channel_query<T>::value)
    return t.supports_channels();
  else
    return true;
}

/// The tag a two-sided transport gives channel `id` when it has no larger tag space: ids below
/// 32767 map to themselves, larger ones wrap above the fingerprint ids (32767 itself is the
/// cost-model calibration's tag). Messages with equal tags between one pair still match in the
/// order both ends post them.
inline int channel_tag(int id) noexcept {
  constexpr int kFirst = 32, kLimit = 32767;
  return id < kLimit ? id : kFirst + (id - kFirst) % (kLimit - kFirst);
}

}  // namespace dtrain
