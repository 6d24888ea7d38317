// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the optional members by which an execution policy shares its device memory with other
// processes of the node (CUDA/HIP IPC), and their detection trait.
//
// OPTIONAL on a policy E (all or none; generic code detects them with has_exec_ipc_v<E>):
//   typename E::ipc_handle_type         a trivially copyable name of one allocation that another
//                                       process can open (cudaIpcMemHandle_t, hipIpcMemHandle_t)
//   bool ipc_available() const          run-time: whether this policy's memory can be shared now
//                                       (the emulated device of the tests: only when asked to)
//   ipc_handle_type ipc_export(void* base)   local: the handle of an allocation from allocator(),
//                                       `base` being the pointer allocator() returned for it;
//                                       DeviceError when the runtime refuses
//   void* ipc_open(const ipc_handle_type&)   local, blocking: another process's allocation
//                                       mapped into this one, usable as exec memory by this
//                                       policy's copies and kernels (the host may not read it);
//                                       DeviceError when the runtime refuses (the vendor's message)
//   void ipc_close(void* p) noexcept    unmaps what ipc_open returned; the exporter's allocation
//                                       itself lives on until its owner frees it
// A handle is opened once per pair of processes and kept: opening is costly (a mapping, and on
// a GPU peer access set up), using the mapping is not. Ordering of the memory between processes
// is the user's: the policy's events are not shared (GradientSync orders its device IPC with
// messages over the transport, see <dtrain/comm/detail/device_ipc.hpp>).
#pragma once

#include <type_traits>
#include <utility>

namespace dtrain {
namespace detail {
template <class E, class = void>
struct exec_ipc_probe : std::false_type {};
template <class E>
struct exec_ipc_probe<
    E, std::void_t<typename E::ipc_handle_type,
                   decltype(bool{std::declval<const E&>().ipc_available()}),
                   decltype(std::declval<E&>().ipc_export(static_cast<void*>(nullptr))),
                   decltype(static_cast<void*>(std::declval<E&>().ipc_open(
                       std::declval<const typename E::ipc_handle_type&>()))),
                   decltype(std::declval<E&>().ipc_close(static_cast<void*>(nullptr)))>>
    : std::bool_constant<
          std::is_trivially_copyable_v<typename E::ipc_handle_type> &&
          std::is_same_v<decltype(std::declval<E&>().ipc_export(static_cast<void*>(nullptr))),
                         typename E::ipc_handle_type>> {};
}  // namespace detail

/// True when policy E has the optional IPC members listed at the top of this header (with a
/// trivially copyable handle type).
template <class E>
inline constexpr bool has_exec_ipc_v = detail::exec_ipc_probe<E>::value;

}  // namespace dtrain
