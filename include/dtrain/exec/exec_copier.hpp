// SPDX-License-Identifier: BSD-3-Clause
// dtrain: ExecCopier, a type-erased handle on one execution policy's copies between host memory
// and the policy's own memory. Code that must not depend on a policy type (the checkpointer's
// snapshot and restore paths) moves device tensors through it.
#pragma once

#include <cstddef>

#include <dtrain/core/space.hpp>
#include <dtrain/exec/exec_traits.hpp>

namespace dtrain {

/// Copies between host memory and the memory of one execution policy object, which it borrows
/// (the policy must outlive the copier). download() and upload() only queue the copy on the
/// policy's compute stream, so it is ordered after every kernel queued there before; the host
/// buffer must stay alive and unchanged until wait() has returned. wait() blocks until every
/// copy queued through this copier (and all earlier compute work) is done, bounded by
/// exec_timeout_s() (TimeoutError naming `operation`). Thread-safety: that of the policy's
/// compute stream (one thread queues at a time). A default-constructed copier is empty.
struct ExecCopier {
  void* exec = nullptr;
  Space space = Space::host;
  void (*download)(void* exec, void* host_dst, const void* src, std::size_t bytes) = nullptr;
  void (*upload)(void* exec, void* dst, const void* host_src, std::size_t bytes) = nullptr;
  void (*wait)(void* exec, const char* operation) = nullptr;

  explicit operator bool() const noexcept { return exec != nullptr; }

  /// The copier of policy object `e` (borrowed).
  template <class Exec>
  static ExecCopier of(Exec& e) {
    ExecCopier c;
    c.exec = &e;
    c.space = Exec::space;
    c.download = [](void* x, void* dst, const void* src, std::size_t bytes) {
      auto& ex = *static_cast<Exec*>(x);
      if (bytes) ex.copy_d2h(ex.compute_stream(), dst, src, bytes);
    };
    c.upload = [](void* x, void* dst, const void* src, std::size_t bytes) {
      auto& ex = *static_cast<Exec*>(x);
      if (bytes) ex.copy_h2d(ex.compute_stream(), dst, src, bytes);
    };
    c.wait = [](void* x, const char* operation) {
      auto& ex = *static_cast<Exec*>(x);
      exec_synchronize(ex, ex.compute_stream(), exec_timeout_s(), operation);
    };
    return c;
  }
};

}  // namespace dtrain
