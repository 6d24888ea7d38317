// SPDX-License-Identifier: BSD-3-Clause
// dtrain: global-norm gradient clipping, on the host or through an execution policy.
#pragma once

#include <cmath>
#include <cstddef>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/kernels/host/memory.hpp>

namespace dtrain {

namespace detail {
// PyTorch's convention (the small constant keeps the scale finite for a zero norm). Clipping
// happens only for a finite norm above max_norm.
inline bool clip_needed(double norm, double max_norm) {
  return std::isfinite(norm) && norm > max_norm;
}
inline double clip_factor(double norm, double max_norm) { return max_norm / (norm + 1e-6); }

inline void check_clip_args(const BufferView& grads, double max_norm) {
  DTRAIN_REQUIRE(max_norm > 0, "clip_grad_norm", "max_norm must be positive, got " << max_norm);
  DTRAIN_REQUIRE(grads.dtype == DType::f32 || grads.dtype == DType::f64, "clip_grad_norm",
                 "gradients must be f32 or f64, got " << name_of(grads.dtype));
}

template <class T>
double clip_norm_impl(T* g, std::size_t n, double max_norm) {
  const double norm = std::sqrt(host::sum_squares(g, n));
  if (clip_needed(norm, max_norm)) host::scale(g, n, static_cast<T>(clip_factor(norm, max_norm)));
  return norm;
}
}  // namespace detail

/// Scales `grads` (host f32 or f64) in place so that their L2 norm is at most `max_norm`, and
/// returns the norm before clipping (sum of squares in double). Local, blocking. Call it after the
/// gradient all-reduce so every rank sees the same norm and clips identically. A non-finite norm
/// is returned unchanged and nothing is scaled. Device gradients: use GradNormClipper.
inline double clip_grad_norm(BufferView grads, double max_norm) {
  detail::check_clip_args(grads, max_norm);
  DTRAIN_REQUIRE(grads.space == Space::host, "clip_grad_norm",
                 "host kernel given " << name_of(grads.space)
                                      << " memory (clip device gradients with GradNormClipper)");
  if (grads.dtype == DType::f32) {
    auto g = grads.as<float>("clip_grad_norm");
    return detail::clip_norm_impl(g.data(), g.size(), max_norm);
  }
  auto g = grads.as<double>("clip_grad_norm");
  return detail::clip_norm_impl(g.data(), g.size(), max_norm);
}

/// clip_grad_norm for gradients in an execution policy's memory (host or device): the sum of
/// squares runs on the policy's compute stream (after the work queued there, such as the
/// backward pass and the copies back of a staged gradient sync), only the norm comes back to the
/// host, and the scaling is queued on the same stream (the next kernels there see it; nothing
/// waits for it). With HostExec the bits equal clip_grad_norm's; a device sums in a different
/// order, so the norm agrees to rounding. Local; each call blocks until the norm is known
/// (bounded by exec_timeout_s(), TimeoutError). The one-double device slot and the host slot are
/// allocated once, at construction. Not thread-safe; borrows the policy, which must outlive it.
template <class Exec>
class GradNormClipper {
 public:
  explicit GradNormClipper(Exec& exec)
      : exec_(&exec),
        slot_({1}, DType::f64, exec.allocator()),
        host_({1}, DType::f64, exec.host_allocator()) {
    static_assert(detail::check_exec_policy<Exec>(), "GradNormClipper needs an execution policy");
  }

  /// Clips `grads` (f32 or f64, memory of the policy's space) to L2 norm `max_norm`; returns the
  /// norm before clipping. Call it after the gradient all-reduce, as clip_grad_norm.
  double operator()(BufferView grads, double max_norm) {
    detail::check_clip_args(grads, max_norm);
    DTRAIN_REQUIRE(grads.space == Exec::space, "clip_grad_norm",
                   "gradients live in " << name_of(grads.space) << " memory but the policy runs on "
                                        << name_of(Exec::space) << " memory");
    return grads.dtype == DType::f32 ? run(static_cast<float*>(grads.data), grads.count, max_norm)
                                     : run(static_cast<double*>(grads.data), grads.count, max_norm);
  }

 private:
  template <class T>
  double run(T* g, std::size_t n, double max_norm) {
    const auto s = exec_->compute_stream();
    auto* slot = static_cast<double*>(slot_.raw());
    auto* host = static_cast<double*>(host_.raw());
    exec_->sum_squares(s, static_cast<const T*>(g), n, slot);
    exec_->copy_d2h(s, host, slot, sizeof(double));
    exec_synchronize(*exec_, s, exec_timeout_s(), "clip_grad_norm");
    const double norm = std::sqrt(*host);
    if (detail::clip_needed(norm, max_norm))
      exec_->scale(s, g, n, static_cast<T>(detail::clip_factor(norm, max_norm)));
    return norm;
  }

  Exec* exec_;
  Tensor slot_;  // exec memory: the sum of squares
  Tensor host_;  // host memory: its copy
};

/// One-off form of GradNormClipper (allocates its two slots on every call: in a training loop,
/// keep a GradNormClipper). Local, blocking.
template <class Exec>
double clip_grad_norm(Exec& exec, BufferView grads, double max_norm) {
  return GradNormClipper<Exec>(exec)(grads, max_norm);
}

}  // namespace dtrain
