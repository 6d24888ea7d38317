// dtrain: stochastic gradient descent with momentum, Nesterov momentum and weight decay.
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

/// SGD hyper-parameters (PyTorch semantics: weight decay is added to the gradient; the momentum
/// buffer starts as the first gradient; dampening scales later gradients).
struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// SGD over a parameter arena and its gradient arena (host, f32 or f64; both views are borrowed
/// and must outlive the optimizer). Every rank applies the same step to the same averaged
/// gradients, so replicas stay identical. Local object, not thread-safe; step() is blocking.
class Sgd {
 public:
  Sgd(BufferView params, BufferView grads, Schedule schedule, SgdOptions options = {},
      Allocator& alloc = default_allocator())
      : params_(params), grads_(grads), schedule_(schedule), opt_(options) {
    detail::check_param_grad(params, grads, "Sgd");
    DTRAIN_REQUIRE(!(options.nesterov && (options.momentum <= 0 || options.dampening != 0)), "Sgd",
                   "Nesterov momentum needs momentum > 0 and dampening 0");
    DTRAIN_REQUIRE(options.momentum >= 0 && options.weight_decay >= 0, "Sgd",
                   "momentum and weight decay must be non-negative");
    if (options.momentum != 0.0)
      momentum_ = Tensor({static_cast<std::int64_t>(params.count)}, params.dtype, alloc);
  }
  /// Same, on any model exposing parameters() and gradients() (e.g. Sequential).
  template <class M, class = std::enable_if_t<detail::has_arenas<M>::value>>
  Sgd(M& model, Schedule schedule, SgdOptions options = {}, Allocator& alloc = default_allocator())
      : Sgd(model.parameters(), model.gradients(), schedule, options, alloc) {}

  /// Applies one update with lr = schedule.lr(step_count()) and advances the step. Local.
  void step() {
    host::SgdParams h;
    h.lr = schedule_.lr(step_);
    h.momentum = opt_.momentum;
    h.dampening = opt_.dampening;
    h.weight_decay = opt_.weight_decay;
    h.nesterov = opt_.nesterov;
    h.first_step = step_ == 0;
    if (params_.dtype == DType::f32)
      host::sgd_update(static_cast<float*>(params_.data), static_cast<const float*>(grads_.data),
                       static_cast<float*>(momentum_.raw()), params_.count, h);
    else
      host::sgd_update(static_cast<double*>(params_.data), static_cast<const double*>(grads_.data),
                       static_cast<double*>(momentum_.raw()), params_.count, h);
    ++step_;
  }

  /// Steps taken so far (also the schedule position).
  std::int64_t step_count() const noexcept { return step_; }
  /// The rate the next step() will use.
  double current_lr() const noexcept { return schedule_.lr(step_); }
  const Schedule& schedule() const noexcept { return schedule_; }
  void set_schedule(Schedule s) noexcept { schedule_ = s; }
  const SgdOptions& options() const noexcept { return opt_; }

  /// Checkpoint protocol: "momentum" (when momentum is used), scalars "step" and "schedule".
  template <class V>
  void visit_state(V& v) {
    if (opt_.momentum != 0.0)
      v.tensor("momentum", momentum_.view(), Shape{static_cast<std::int64_t>(params_.count)});
    v.scalar("step", step_);
    detail::visit_schedule(v, schedule_, "Sgd");
  }

 private:
  BufferView params_, grads_;
  Schedule schedule_;
  SgdOptions opt_;
  Tensor momentum_;
  std::int64_t step_ = 0;
};

}  // namespace dtrain
