// dtrain: AdamW (Adam with decoupled weight decay and bias correction).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_state.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/kernels/host/optim.hpp>
#include <dtrain/optim/detail/optim_common.hpp>
#include <dtrain/optim/detail/state_arenas.hpp>
#include <dtrain/optim/schedule.hpp>

namespace dtrain {

/// AdamW hyper-parameters (Loshchilov and Hutter, "Decoupled Weight Decay Regularization").
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

/// AdamW over a parameter arena and its gradient arena (f32 or f64, exec memory of policy Exec;
/// both views borrowed, they must outlive the optimizer). Update, with t = step_count() + 1:
///   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
///   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
/// The moments are exec memory from the policy's allocator, made (zeroed) on first use: a state
/// sharded before then (shard_state, GradientSync::shard_updates) is never whole-sized. Updates
/// are queued on the policy's compute stream. Local object, not thread-safe.
template <class Exec = HostExec>
class BasicAdamW {
  static_assert(detail::check_exec_policy<Exec>(), "BasicAdamW needs an execution policy");

 public:
  using exec_type = Exec;

  /// Runs on `exec` (borrowed; it must outlive the optimizer).
  BasicAdamW(Exec& exec, BufferView params, BufferView grads, Schedule schedule,
             AdamWOptions options = {})
      : BasicAdamW(detail::ExecHolder<Exec>(exec), params, grads, schedule, options) {}
  /// Runs on a policy of its own made from `alloc` (HostExec: host memory).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  BasicAdamW(BufferView params, BufferView grads, Schedule schedule, AdamWOptions options = {},
             Allocator& alloc = default_allocator())
      : BasicAdamW(detail::ExecHolder<Exec>(std::make_unique<Exec>(alloc)), params, grads, schedule,
                   options) {}
  /// Same, on any model exposing parameters() and gradients() (e.g. Sequential), on the model's
  /// policy when it has one.
  template <class M, class = std::enable_if_t<detail::has_arenas<M>::value>>
  BasicAdamW(M& model, Schedule schedule, AdamWOptions options = {})
      : BasicAdamW(detail::ExecHolder<Exec>::of_model(model), model.parameters(), model.gradients(),
                   schedule, options) {}

  /// Queues one update with lr = schedule.lr(step_count()) and advances the step. Local.
  void step() {
    update(0, params_.count);
    complete_step();
  }
  /// Queues the current step's update of elements [offset, offset + count) only, without
  /// advancing the step; every element once, then complete_step(), gives the same bits as
  /// step() (the update is element-wise). Local; throws InvalidArgument on a range outside the
  /// arena, or, while the state is sharded (shard_state), on one that is not inside one of its
  /// parts.
  void update(std::size_t offset, std::size_t count) {
    detail::check_range(offset, count, params_.count, "AdamW::update");
    if (count == 0) return;
    const std::size_t at = state_.locate(offset, count, "AdamW::update");
    host::AdamWParams h;
    h.lr = schedule_.lr(step_);
    h.beta1 = opt_.beta1;
    h.beta2 = opt_.beta2;
    h.eps = opt_.eps;
    h.weight_decay = opt_.weight_decay;
    h.step = step_ + 1;
    if (params_.dtype == DType::f32)
      run<float>(offset, at, count, h);
    else
      run<double>(offset, at, count, h);
  }
  /// Ends a step whose elements were all given to update(). Local.
  void complete_step() noexcept { ++step_; }

  std::int64_t step_count() const noexcept { return step_; }
  double current_lr() const noexcept { return schedule_.lr(step_); }
  const Schedule& schedule() const noexcept { return schedule_; }
  void set_schedule(Schedule s) noexcept { schedule_ = s; }
  const AdamWOptions& options() const noexcept { return opt_; }
  Exec& exec() const noexcept { return exec_.get(); }
  /// First and second moments (exec memory; the parameter arena's layout, or while sharded its
  /// parts back to back). Makes them (zeros) if not made yet.
  BufferView exp_avg() const { return state_.view(exec_.get(), 0); }
  BufferView exp_avg_sq() const { return state_.view(exec_.get(), 1); }

  /// Calls f(BufferView) for each state arena (exp_avg, then exp_avg_sq). Local.
  template <class F>
  void for_each_state_arena(F&& f) {
    state_.for_each(exec_.get(), f);
  }
  /// Sharded updates (GradientSync::shard_updates): keeps the state of `parts` (first element,
  /// count; ascending, disjoint) only, back to back in arenas of their total size, and frees the
  /// whole-sized ones (before the state's first use none are made); update() then takes ranges
  /// inside one part only, and the state is partial (only a visitor that takes parts saves it)
  /// until GradientSync::gather_state. Again with the same parts: nothing. Local, blocking (waits
  /// for the compute stream). Throws InvalidArgument on parts out of order or outside the arena,
  /// and on other parts while sharded.
  void shard_state(const detail::StateShards::Parts& parts) {
    state_.shard(exec_.get(), parts, "AdamW::shard_state");
  }
  /// Whole-sized arenas again, this rank's parts in place and zeros elsewhere: still partial
  /// until the parts of the other ranks are gathered into them (GradientSync::gather_state).
  /// Nothing when not sharded. Local, blocking.
  void unshard_state() { state_.unshard(exec_.get(), "AdamW::unshard_state"); }
  /// Elements per state arena in memory: the arena's, or while sharded its parts' total.
  std::size_t state_elements() const noexcept { return state_.elements(); }
  /// Marks the whole-sized state current everywhere (after a gather) or partial. Local.
  void set_state_partial(bool partial) noexcept { state_.set_partial(partial); }
  /// Whether the state is current only in this rank's parts (sharded, or not yet gathered).
  bool state_partial() const noexcept { return state_.partial(); }

  /// Checkpoint protocol: tensors "exp_avg", "exp_avg_sq" (staged through host memory on a
  /// device, see StateMirror); scalars "step" and "schedule". Blocking. Saving throws
  /// InvalidArgument while the state is partial (see set_state_partial), except that while it is
  /// sharded a visitor that takes parts (the checkpointer's save) gets this rank's parts
  /// (tensor_parts), so no gather is needed. Loading a whole state makes it whole; loading into
  /// a sharded one keeps this rank's parts of it (each tensor whole only while it loads), so
  /// that a restore does not undo the sharding's saving.
  template <class V>
  void visit_state(V& v) {
    state_.visit(exec_.get(), v, "AdamW::visit_state");
    v.scalar("step", step_);
    detail::visit_schedule(v, schedule_, "AdamW");
  }

 private:
  BasicAdamW(detail::ExecHolder<Exec> exec, BufferView params, BufferView grads, Schedule schedule,
             AdamWOptions options)
      : exec_(std::move(exec)),
        params_(params),
        grads_(grads),
        schedule_(schedule),
        opt_(options),
        state_({"exp_avg", "exp_avg_sq"}, params.count, params.dtype, true) {
    detail::check_param_grad(params, grads, "AdamW", Exec::space);
    DTRAIN_REQUIRE(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                       options.beta2 < 1 && options.eps > 0 && options.weight_decay >= 0,
                   "AdamW",
                   "need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got beta1="
                       << options.beta1 << " beta2=" << options.beta2 << " eps=" << options.eps
                       << " weight_decay=" << options.weight_decay);
  }
  template <class T>
  void run(std::size_t offset, std::size_t at, std::size_t count, const host::AdamWParams& h) {
    Exec& e = exec_.get();
    e.adamw_update(e.compute_stream(), static_cast<T*>(params_.data) + offset,
                   static_cast<const T*>(grads_.data) + offset,
                   static_cast<T*>(state_.data(e, 0)) + at, static_cast<T*>(state_.data(e, 1)) + at,
                   count, h);
  }

  detail::ExecHolder<Exec> exec_;
  BufferView params_, grads_;
  Schedule schedule_;
  AdamWOptions opt_;
  detail::StateArenas<Exec, 2> state_;  // the moments, made on first use
  std::int64_t step_ = 0;
};

/// AdamW on the host.
using AdamW = BasicAdamW<HostExec>;

}  // namespace dtrain
