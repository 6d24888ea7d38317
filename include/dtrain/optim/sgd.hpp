// dtrain: stochastic gradient descent with momentum, Nesterov momentum and weight decay.
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

/// SGD hyper-parameters (PyTorch semantics: weight decay is added to the gradient; the momentum
/// buffer starts as the first gradient; dampening scales later gradients).
struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// SGD over a parameter arena and its gradient arena (f32 or f64, exec memory of policy Exec;
/// both views are borrowed and must outlive the optimizer). Every rank applies the same step to
/// the same averaged gradients, so replicas stay identical. The momentum buffer is exec memory
/// from the policy's allocator, made (zeroed) on first use: a state sharded before then
/// (shard_state, GradientSync::shard_updates) is never whole-sized. Updates are queued on the
/// policy's compute stream. Local object, not thread-safe.
template <class Exec = HostExec>
class BasicSgd {
  static_assert(detail::check_exec_policy<Exec>(), "BasicSgd needs an execution policy");

 public:
  using exec_type = Exec;

  /// Runs on `exec` (borrowed; it must outlive the optimizer).
  BasicSgd(Exec& exec, BufferView params, BufferView grads, Schedule schedule,
           SgdOptions options = {})
      : BasicSgd(detail::ExecHolder<Exec>(exec), params, grads, schedule, options) {}
  /// Runs on a policy of its own made from `alloc` (HostExec: host memory).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  BasicSgd(BufferView params, BufferView grads, Schedule schedule, SgdOptions options = {},
           Allocator& alloc = default_allocator())
      : BasicSgd(detail::ExecHolder<Exec>(std::make_unique<Exec>(alloc)), params, grads, schedule,
                 options) {}
  /// Same, on any model exposing parameters() and gradients() (e.g. Sequential), on the model's
  /// policy when it has one.
  template <class M, class = std::enable_if_t<detail::has_arenas<M>::value>>
  BasicSgd(M& model, Schedule schedule, SgdOptions options = {})
      : BasicSgd(detail::ExecHolder<Exec>::of_model(model), model.parameters(), model.gradients(),
                 schedule, options) {}

  /// Queues one update with lr = schedule.lr(step_count()) and advances the step. Local.
  void step() {
    update(0, params_.count);
    complete_step();
  }
  /// Queues the current step's update of elements [offset, offset + count) only, without
  /// advancing the step: updating every element once this way and then calling complete_step()
  /// gives the same bits as step() (the update is element-wise). Lets a gradient sync update
  /// each bucket as soon as its average has arrived. Local; throws InvalidArgument on a range
  /// outside the arena, or, while the state is sharded (shard_state), on one that is not inside
  /// one of its parts.
  void update(std::size_t offset, std::size_t count) {
    detail::check_range(offset, count, params_.count, "Sgd::update");
    if (count == 0) return;
    const std::size_t at = state_.locate(offset, count, "Sgd::update");
    host::SgdParams h;
    h.lr = schedule_.lr(step_);
    h.momentum = opt_.momentum;
    h.dampening = opt_.dampening;
    h.weight_decay = opt_.weight_decay;
    h.nesterov = opt_.nesterov;
    h.first_step = step_ == 0;
    if (params_.dtype == DType::f32)
      run<float>(offset, at, count, h);
    else
      run<double>(offset, at, count, h);
  }
  /// Ends a step whose elements were all given to update(). Local.
  void complete_step() noexcept { ++step_; }

  /// Steps taken so far (also the schedule position).
  std::int64_t step_count() const noexcept { return step_; }
  /// The rate the next step() will use.
  double current_lr() const noexcept { return schedule_.lr(step_); }
  const Schedule& schedule() const noexcept { return schedule_; }
  void set_schedule(Schedule s) noexcept { schedule_ = s; }
  const SgdOptions& options() const noexcept { return opt_; }
  Exec& exec() const noexcept { return exec_.get(); }

  /// Calls f(BufferView) for each state arena (the momentum buffer, when momentum is used; exec
  /// memory in the parameter arena's layout, or while sharded its parts back to back). Local.
  template <class F>
  void for_each_state_arena(F&& f) {
    state_.for_each(exec_.get(), f);
  }
  /// Sharded updates (GradientSync::shard_updates): keeps the momentum of `parts` (first
  /// element, count; ascending, disjoint) only, back to back in a buffer of their total size, and
  /// frees the whole-sized one (before the state's first use none is made); update() then takes
  /// ranges inside one part only, and the state is partial (only a visitor that takes parts saves
  /// it) until GradientSync::gather_state. Again with the same parts: nothing. Local, blocking
  /// (waits for the compute stream). Throws InvalidArgument on parts out of order or outside the
  /// arena, and on other parts while sharded.
  void shard_state(const detail::StateShards::Parts& parts) {
    state_.shard(exec_.get(), parts, "Sgd::shard_state");
  }
  /// A whole-sized momentum buffer again, this rank's parts in place and zeros elsewhere: still
  /// partial until the other ranks' parts are gathered into it (GradientSync::gather_state).
  /// Nothing when not sharded. Local, blocking.
  void unshard_state() { state_.unshard(exec_.get(), "Sgd::unshard_state"); }
  /// Elements per state arena in memory: the arena's, or while sharded its parts' total (0
  /// without momentum).
  std::size_t state_elements() const noexcept { return state_.elements(); }
  /// Marks the whole-sized state current everywhere (after a gather) or partial. Local.
  void set_state_partial(bool partial) noexcept { state_.set_partial(partial); }
  /// Whether the state is current only in this rank's parts (sharded, or not yet gathered).
  bool state_partial() const noexcept { return state_.partial(); }

  /// Checkpoint protocol: "momentum" (when momentum is used; staged through host memory on a
  /// device, see StateMirror), scalars "step" and "schedule". Blocking. Saving throws
  /// InvalidArgument while the state is partial (see set_state_partial), except that while it is
  /// sharded a visitor that takes parts (the checkpointer's save) gets this rank's parts
  /// (tensor_parts), so no gather is needed. Loading a whole state makes it whole; loading into
  /// a sharded one keeps this rank's parts of it (the momentum whole only while it loads).
  template <class V>
  void visit_state(V& v) {
    state_.visit(exec_.get(), v, "Sgd::visit_state");
    v.scalar("step", step_);
    detail::visit_schedule(v, schedule_, "Sgd");
  }

 private:
  BasicSgd(detail::ExecHolder<Exec> exec, BufferView params, BufferView grads, Schedule schedule,
           SgdOptions options)
      : exec_(std::move(exec)),
        params_(params),
        grads_(grads),
        schedule_(schedule),
        opt_(options),
        state_({"momentum"}, params.count, params.dtype, options.momentum != 0.0) {
    detail::check_param_grad(params, grads, "Sgd", Exec::space);
    DTRAIN_REQUIRE(!(options.nesterov && (options.momentum <= 0 || options.dampening != 0)), "Sgd",
                   "Nesterov momentum needs momentum > 0 and dampening 0");
    DTRAIN_REQUIRE(options.momentum >= 0 && options.weight_decay >= 0, "Sgd",
                   "momentum and weight decay must be non-negative");
  }
  template <class T>
  void run(std::size_t offset, std::size_t at, std::size_t count, const host::SgdParams& h) {
    Exec& e = exec_.get();
    T* buf = static_cast<T*>(state_.data(e, 0));
    e.sgd_update(e.compute_stream(), static_cast<T*>(params_.data) + offset,
                 static_cast<const T*>(grads_.data) + offset, buf ? buf + at : nullptr, count, h);
  }

  detail::ExecHolder<Exec> exec_;
  BufferView params_, grads_;
  Schedule schedule_;
  SgdOptions opt_;
  detail::StateArenas<Exec, 1> state_;  // the momentum (when used), made on first use
  std::int64_t step_ = 0;
};

/// SGD on the host.
using Sgd = BasicSgd<HostExec>;

}  // namespace dtrain
