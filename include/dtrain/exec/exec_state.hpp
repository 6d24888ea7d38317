// SPDX-License-Identifier: BSD-3-Clause
// dtrain: handing exec-memory tensors to state visitors (checkpointers, comparers, hashers),
// which read and write host memory and may keep the views they are given until they are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_copier.hpp>
#include <dtrain/exec/exec_traits.hpp>

namespace dtrain {

namespace detail {
// Whether a state visitor moves exec-memory tensors itself: it has
// tensor(name, BufferView, Shape, const ExecCopier&) (the checkpointer's visitors do).
template <class V, class = void>
struct visitor_takes_exec_tensors : std::false_type {};
template <class V>
struct visitor_takes_exec_tensors<
    V, std::void_t<decltype(std::declval<V&>().tensor(
           std::declval<const std::string&>(), std::declval<BufferView>(), std::declval<Shape>(),
           std::declval<const ExecCopier&>()))>> : std::true_type {};
}  // namespace detail

/// The host side of an exec-memory arena in the state protocol (<dtrain/core/state.hpp>). With a
/// policy whose memory is host memory, visit() hands the arena's own view over. A visitor that
/// moves exec memory itself (it has `tensor(name, view, shape, const ExecCopier&)`, as the
/// checkpointer's do: they stage through their own snapshot buffer) gets the exec-memory view
/// and the policy's copier, and no mirror is allocated. Otherwise the tensor goes through a host
/// mirror of the arena (from exec.host_allocator(), allocated on first
/// use): downloaded and waited for before a saving visitor reads it, uploaded and waited for
/// after a loading visitor wrote it. So a checkpoint holds the same bytes whichever policy wrote
/// it and restores into any policy. The views handed over stay valid until the owner's next
/// visit (a checkpointer may collect them first and copy later). Local object of the arena's
/// owner; not thread-safe.
template <class Exec>
class StateMirror {
 public:
  /// Visits elements [offset, offset + count) of `arena` as tensor `name` of shape `shape`.
  /// Blocking (bounded by exec_timeout_s()); work queued on the compute stream before it is
  /// ordered before the download.
  template <class V>
  void visit(Exec& exec, V& v, const std::string& name, const Tensor& arena, std::size_t offset,
             std::size_t count, Shape shape) {
    visit(exec, v, name, arena.view(), offset, count, std::move(shape));
  }
  /// Same for an arena the owner does not hold as a Tensor (memory of the policy's space that
  /// another owner allocated, such as an application's own parameter buffer).
  template <class V>
  void visit(Exec& exec, V& v, const std::string& name, BufferView arena, std::size_t offset,
             std::size_t count, Shape shape) {
    const BufferView view = arena.slice(offset, count);
    if constexpr (Exec::space == Space::host) {
      v.tensor(name, view, std::move(shape));
    } else if constexpr (detail::visitor_takes_exec_tensors<V>::value) {
      v.tensor(name, view, std::move(shape), ExecCopier::of(exec));
    } else {
      if (host_.size() != arena.count || host_.dtype() != arena.dtype)
        host_ =
            Tensor({static_cast<std::int64_t>(arena.count)}, arena.dtype, exec.host_allocator());
      const BufferView mirror = host_.view().slice(offset, count);
      const auto s = exec.compute_stream();
      const bool loading = v.loading();
      if (!loading) {
        exec.copy_d2h(s, mirror.data, view.data, view.bytes());
        exec_synchronize(exec, s, exec_timeout_s(), "checkpoint: download of a device tensor");
      }
      v.tensor(name, mirror, std::move(shape));
      if (loading) {
        exec.copy_h2d(s, view.data, mirror.data, view.bytes());
        exec_synchronize(exec, s, exec_timeout_s(), "checkpoint: upload of a device tensor");
      }
    }
  }

  /// Visitors that take parts (visitor_takes_parts): visits `held`, this rank's `parts` of a
  /// tensor of shape `whole` back to back, as v.tensor_parts (saving, or loading where
  /// visitor_loads_parts). Exec memory goes through the host mirror (downloaded and waited for
  /// first, or uploaded after a load). Blocking.
  template <class V>
  void visit_parts(Exec& exec, V& v, const std::string& name, const Tensor& held, Shape whole,
                   const StateParts& parts) {
    static_assert(visitor_takes_parts<V>::value,
                  "StateMirror::visit_parts: the visitor has no tensor_parts");
    if constexpr (Exec::space == Space::host) {
      v.tensor_parts(name, held.view(), std::move(whole), parts);
    } else {
      if (host_.size() != held.size() || host_.dtype() != held.dtype())
        host_ =
            Tensor({static_cast<std::int64_t>(held.size())}, held.dtype(), exec.host_allocator());
      const auto s = exec.compute_stream();
      const bool loading = v.loading();
      if (!loading) {
        exec.copy_d2h(s, host_.raw(), held.raw(), held.view().bytes());
        exec_synchronize(exec, s, exec_timeout_s(), "checkpoint: download of a device tensor");
      }
      v.tensor_parts(name, host_.view(), std::move(whole), parts);
      if (loading) {
        exec.copy_h2d(s, const_cast<void*>(held.raw()), host_.raw(), held.view().bytes());
        exec_synchronize(exec, s, exec_timeout_s(), "checkpoint: upload of a device tensor");
      }
    }
  }

 private:
  Tensor host_;
};

}  // namespace dtrain
