// dtrain: AdamW (Adam with decoupled weight decay and bias correction).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/kernels/host/optim.hpp>
#include <dtrain/optim/detail/optim_common.hpp>
#include <dtrain/optim/schedule.hpp>

namespace dtrain {

/// AdamW hyper-parameters (Loshchilov and Hutter, "Decoupled Weight Decay Regularization").
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

/// AdamW over a parameter arena and its gradient arena (host, f32 or f64; both views borrowed,
/// they must outlive the optimizer). Update, with t = step_count() + 1:
///   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
///   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
/// Local object, not thread-safe; step() is blocking. Moments live in the allocator's memory.
class AdamW {
 public:
  AdamW(BufferView params, BufferView grads, Schedule schedule, AdamWOptions options = {},
        Allocator& alloc = default_allocator())
      : params_(params), grads_(grads), schedule_(schedule), opt_(options) {
    detail::check_param_grad(params, grads, "AdamW");
    DTRAIN_REQUIRE(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                       options.beta2 < 1 && options.eps > 0 && options.weight_decay >= 0,
                   "AdamW",
                   "need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got beta1="
                       << options.beta1 << " beta2=" << options.beta2 << " eps=" << options.eps
                       << " weight_decay=" << options.weight_decay);
    const Shape shape{static_cast<std::int64_t>(params.count)};
    exp_avg_ = Tensor(shape, params.dtype, alloc);
    exp_avg_sq_ = Tensor(shape, params.dtype, alloc);
  }
  /// Same, on any model exposing parameters() and gradients() (e.g. Sequential).
  template <class M, class = std::enable_if_t<detail::has_arenas<M>::value>>
  AdamW(M& model, Schedule schedule, AdamWOptions options = {},
        Allocator& alloc = default_allocator())
      : AdamW(model.parameters(), model.gradients(), schedule, options, alloc) {}

  /// Applies one update with lr = schedule.lr(step_count()) and advances the step. Local.
  void step() {
    host::AdamWParams h;
    h.lr = schedule_.lr(step_);
    h.beta1 = opt_.beta1;
    h.beta2 = opt_.beta2;
    h.eps = opt_.eps;
    h.weight_decay = opt_.weight_decay;
    h.step = step_ + 1;
    if (params_.dtype == DType::f32)
      host::adamw_update(static_cast<float*>(params_.data), static_cast<const float*>(grads_.data),
                         static_cast<float*>(exp_avg_.raw()),
                         static_cast<float*>(exp_avg_sq_.raw()), params_.count, h);
    else
      host::adamw_update(static_cast<double*>(params_.data),
                         static_cast<const double*>(grads_.data),
                         static_cast<double*>(exp_avg_.raw()),
                         static_cast<double*>(exp_avg_sq_.raw()), params_.count, h);
    ++step_;
  }

  std::int64_t step_count() const noexcept { return step_; }
  double current_lr() const noexcept { return schedule_.lr(step_); }
  const Schedule& schedule() const noexcept { return schedule_; }
  void set_schedule(Schedule s) noexcept { schedule_ = s; }
  const AdamWOptions& options() const noexcept { return opt_; }
  /// First and second moments (same layout as the parameter arena).
  BufferView exp_avg() const noexcept { return exp_avg_.view(); }
  BufferView exp_avg_sq() const noexcept { return exp_avg_sq_.view(); }

  /// Checkpoint protocol: tensors "exp_avg", "exp_avg_sq"; scalars "step" and "schedule".
  template <class V>
  void visit_state(V& v) {
    const Shape shape{static_cast<std::int64_t>(params_.count)};
    v.tensor("exp_avg", exp_avg_.view(), shape);
    v.tensor("exp_avg_sq", exp_avg_sq_.view(), shape);
    v.scalar("step", step_);
    detail::visit_schedule(v, schedule_, "AdamW");
  }

 private:
  BufferView params_, grads_;
  Schedule schedule_;
  AdamWOptions opt_;
  Tensor exp_avg_, exp_avg_sq_;
  std::int64_t step_ = 0;
};

}  // namespace dtrain
