// SPDX-License-Identifier: BSD-3-Clause
// dtrain: memory registration, the one transport requirement about memory rather than messages.
//
// Required of every transport (a no-op for MPI, ibv_reg_mr for verbs):
//   MemoryRegion register_memory(void* data, std::size_t bytes, Space space);
//     plan-time registration; the region it returns is what later calls name the memory by
//     (persistent channels take it at bind time, see transport_channels.hpp)
//   void deregister_memory(MemoryRegion&) noexcept;
// Whether the plan must register every buffer it moves is a capability
// (requires_registration, see transport_capabilities.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <dtrain/core/detect.hpp>
#include <dtrain/core/space.hpp>

namespace dtrain {

/// A registered memory range, as returned by a transport's register_memory. `key` is whatever the
/// transport needs to reach the memory remotely (0 for transports that need nothing).
struct MemoryRegion {
  void* data = nullptr;
  std::size_t bytes = 0;
  Space space = Space::host;
  std::uint64_t key = 0;
  void* handle = nullptr;  ///< transport-private (e.g. an ibv_mr*)
};

namespace detail {

template <class T>
using register_memory_call = decltype(std::declval<T&>().register_memory(
    static_cast<void*>(nullptr), std::size_t{}, Space::host));
template <class T>
using deregister_memory_call =
    decltype(std::declval<T&>().deregister_memory(std::declval<MemoryRegion&>()));

/// Whether T registers and deregisters memory as above.
template <class T>
using has_registration = std::conjunction<is_detected_exact<MemoryRegion, register_memory_call, T>,
                                          is_detected<deregister_memory_call, T>>;

}  // namespace detail
}  // namespace dtrain
