// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what the element-wise optimizers (SGD, AdamW) share: construction on a policy, the step
// count and schedule, the update of a range of the arena, the state arenas (made on first use,
// sharded, checkpointed). An optimizer is this frame over a rule that says what its state is and
// which update the policy queues.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/optim/detail/optim_common.hpp>
#include <dtrain/optim/detail/state_arenas.hpp>
#include <dtrain/optim/schedule.hpp>

namespace dtrain {
namespace detail {

// A model whose arenas may hold parts of larger ones (a fully sharded Sequential).
template <class M, class = void>
struct has_arena_parts : std::false_type {};
template <class M>
struct has_arena_parts<M, std::void_t<decltype(bool(std::declval<const M&>().fully_sharded())),
                                      decltype(std::size_t(std::declval<const M&>().arena_count())),
                                      decltype(StateParts(std::declval<const M&>().arena_parts()))>>
    : std::true_type {};
// A model that shares its arenas as they change (arena_binding(), e.g. Sequential).
template <class M, class = void>
struct has_arena_binding : std::false_type {};
template <class M>
struct has_arena_binding<M, std::void_t<decltype(std::shared_ptr<const ArenaBinding>(
                                std::declval<const M&>().arena_binding()))>> : std::true_type {};

/// The operation names an optimizer's errors and warnings carry.
struct OptimizerLabels {
  const char* name;           // "Sgd"
  const char* update;         // "Sgd::update"
  const char* shard_state;    // "Sgd::shard_state"
  const char* unshard_state;  // "Sgd::unshard_state"
  const char* visit_state;    // "Sgd::visit_state"
};

/// An element-wise optimizer over a parameter arena and its gradient arena (f32 or f64, exec
/// memory of policy Exec; both views borrowed, they must outlive the optimizer), its state in
/// Rule::states arenas of exec memory from the policy's allocator, made (zeroed) on first use: a
/// state sharded before then (shard_state, GradientSync::shard_updates) is never whole-sized.
/// Updates are queued on the policy's compute stream. Local object, not thread-safe.
///
/// Rule provides: options_type and params_type (the host kernel's hyper-parameters); `states`,
/// state_names() and uses_state(options) (false: no arenas, e.g. SGD without momentum);
/// `labels` (OptimizerLabels); check_options(options), which throws InvalidArgument;
/// params(options, lr, step) for the step about to be taken; and
/// queue(exec, p, g, state, count, params), which queues the update of `count` elements with
/// `state` holding each arena's first element for them (null when not used).
template <class Exec, class Rule>
class ElementwiseOptimizer {
  static_assert(check_exec_policy<Exec>(), "an optimizer needs an execution policy");

 public:
  using exec_type = Exec;
  using options_type = typename Rule::options_type;

  /// Runs on `exec` (borrowed; it must outlive the optimizer).
  ElementwiseOptimizer(Exec& exec, BufferView params, BufferView grads, Schedule schedule,
                       options_type options = {})
      : ElementwiseOptimizer(ExecHolder<Exec>(exec), params, grads, schedule, options) {}
  /// Runs on a policy of its own made from `alloc` (HostExec: host memory).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  ElementwiseOptimizer(BufferView params, BufferView grads, Schedule schedule,
                       options_type options = {}, Allocator& alloc = default_allocator())
      : ElementwiseOptimizer(ExecHolder<Exec>(std::make_unique<Exec>(alloc)), params, grads,
                             schedule, options) {}
  /// Same, on any model exposing parameters() and gradients() (e.g. Sequential), on the model's
  /// policy when it has one. A fully sharded model's arenas hold its parts of the whole arenas
  /// (arena_parts()): the optimizer then holds the state of those parts only (hold_parts). A
  /// model that shares its arenas (arena_binding(), Sequential) is followed: when it is fully
  /// sharded after the optimizer was made (FullyShardedSync frees its whole arenas), the
  /// optimizer's next use works on the parts, its state (when made) kept for them.
  template <class M, class = std::enable_if_t<has_arenas<M>::value>>
  ElementwiseOptimizer(M& model, Schedule schedule, options_type options = {})
      : ElementwiseOptimizer(ExecHolder<Exec>::of_model(model), model.parameters(),
                             model.gradients(), schedule, options) {
    if constexpr (has_arena_binding<M>::value) {
      binding_ = model.arena_binding();
      if (binding_) seen_ = binding_->version;
    }
    if constexpr (has_arena_parts<M>::value)
      if (model.fully_sharded()) hold_parts(model.arena_count(), model.arena_parts());
  }

  /// Fully sharded arenas: the parameter and gradient views given at construction hold the
  /// elements `parts` (first element, count; ascending, disjoint; their counts add up to the
  /// views' size) of whole arenas of n elements, back to back. From then on offsets are the whole
  /// arena's (update(offset, count) within one part; step() updates every part), the state is
  /// held for the parts only (sharded for good: unshard_state refuses) and a checkpoint saves
  /// and loads it as the whole arena's state. Call it before the first step. Local, blocking.
  /// Throws InvalidArgument on parts that do not fit.
  void hold_parts(std::size_t n, const StateShards::Parts& parts) {
    follow();
    std::size_t total = 0;
    for (const auto& part : parts) total += part.second;
    DTRAIN_REQUIRE(total == params_.count && n >= total, Rule::labels.shard_state,
                   "parts of " << total << " elements for arenas of " << params_.count
                               << " elements held of " << n);
    DTRAIN_REQUIRE(step_ == 0 && !compact_, Rule::labels.shard_state,
                   "hold_parts comes before the first step, once");
    state_ = StateArenas<Exec, Rule::states>(Rule::state_names(), n, params_.dtype,
                                             Rule::uses_state(opt_));
    state_.shard(exec_.get(), parts, Rule::labels.shard_state);
    arena_elements_ = n;
    compact_ = true;
    for (const auto& part : parts)
      if (part.second) compact_parts_.push_back(part);
  }
  /// Whether the arenas hold parts of larger ones (hold_parts).
  bool holds_parts() const {
    follow();
    return compact_;
  }
  /// The parameter arena the updates write (exec memory): the view given at construction, or
  /// for an optimizer made from a model the model's arenas now. Local.
  BufferView parameter_arena() const {
    follow();
    return params_;
  }

  /// Queues one update with lr = schedule.lr(step_count()) and advances the step. Local.
  void step() {
    follow();
    if (compact_)
      for (const auto& [first, count] : compact_parts_) update(first, count);
    else
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
    follow();
    check_range(offset, count, arena_elements_, Rule::labels.update);
    if (count == 0) return;
    const std::size_t at = state_.locate(offset, count, Rule::labels.update);
    const typename Rule::params_type h = Rule::params(opt_, schedule_.lr(step_), step_);
    // Held parts: the parameters and gradients lie where the state does.
    const std::size_t where = compact_ ? at : offset;
    if (params_.dtype == DType::f32)
      run<float>(where, at, count, h);
    else
      run<double>(where, at, count, h);
  }
  /// Ends a step whose elements were all given to update(). Local.
  void complete_step() noexcept { ++step_; }

  /// Steps taken so far (also the schedule position).
  std::int64_t step_count() const noexcept { return step_; }
  /// The rate the next step() will use.
  double current_lr() const noexcept { return schedule_.lr(step_); }
  const Schedule& schedule() const noexcept { return schedule_; }
  void set_schedule(Schedule s) noexcept { schedule_ = s; }
  const options_type& options() const noexcept { return opt_; }
  Exec& exec() const noexcept { return exec_.get(); }

  /// Calls f(BufferView) for each state arena, in the rule's order (exec memory in the parameter
  /// arena's layout, or while sharded its parts back to back; none when the state is not used).
  /// Local.
  template <class F>
  void for_each_state_arena(F&& f) {
    follow();
    state_.for_each(exec_.get(), f);
  }
  /// Sharded updates (GradientSync::shard_updates): keeps the state of `parts` (first element,
  /// count; ascending, disjoint) only, back to back in arenas of their total size, and frees the
  /// whole-sized ones (before the state's first use none are made); update() then takes ranges
  /// inside one part only, and the state is partial (only a visitor that takes parts saves it)
  /// until GradientSync::gather_state. Again with the same parts: nothing. Local, blocking (waits
  /// for the compute stream). Throws InvalidArgument on parts out of order or outside the arena,
  /// and on other parts while sharded.
  void shard_state(const StateShards::Parts& parts) {
    follow();
    state_.shard(exec_.get(), parts, Rule::labels.shard_state);
  }
  /// Whole-sized arenas again, this rank's parts in place and zeros elsewhere: still partial
  /// until the parts of the other ranks are gathered into them (GradientSync::gather_state).
  /// Nothing when not sharded. Local, blocking.
  void unshard_state() {
    follow();
    DTRAIN_REQUIRE(!compact_, Rule::labels.unshard_state,
                   "the arenas hold parts (hold_parts): the state stays in parts");
    state_.unshard(exec_.get(), Rule::labels.unshard_state);
  }
  /// Elements per state arena in memory: the arena's, or while sharded its parts' total (0 when
  /// the state is not used).
  std::size_t state_elements() const {
    follow();
    return state_.elements();
  }
  /// Marks the whole-sized state current everywhere (after a gather) or partial. Local.
  void set_state_partial(bool partial) {
    follow();
    state_.set_partial(partial);
  }
  /// Whether the state is current only in this rank's parts (sharded, or not yet gathered).
  bool state_partial() const {
    follow();
    return state_.partial();
  }

  /// Checkpoint protocol: the state arenas as tensors of the rule's names (staged through host
  /// memory on a device, see StateMirror), scalars "step" and "schedule". Blocking. Saving throws
  /// InvalidArgument while the state is partial (see set_state_partial), except that while it is
  /// sharded a visitor that takes parts (the checkpointer's save) gets this rank's parts
  /// (tensor_parts), so no gather is needed. Loading a whole state makes it whole; loading into
  /// a sharded one keeps this rank's parts of it (each tensor whole only while it loads), so
  /// that a restore does not undo the sharding's saving.
  template <class V>
  void visit_state(V& v) {
    follow();
    state_.visit(exec_.get(), v, Rule::labels.visit_state);
    v.scalar("step", step_);
    visit_schedule(v, schedule_, Rule::labels.name);
  }

 protected:
  /// State arena i as a view (made, zeros, if not made yet).
  BufferView state_view(std::size_t i) const {
    follow();
    return state_.view(exec_.get(), i);
  }

 private:
  ElementwiseOptimizer(ExecHolder<Exec> exec, BufferView params, BufferView grads,
                       Schedule schedule, options_type options)
      : exec_(std::move(exec)),
        params_(params),
        grads_(grads),
        schedule_(schedule),
        opt_(options),
        state_(Rule::state_names(), params.count, params.dtype, Rule::uses_state(options)),
        arena_elements_(params.count) {
    check_param_grad(params, grads, Rule::labels.name, Exec::space);
    Rule::check_options(options);
  }
  // Catches up with the model's arenas when it replaced them since the last call (see the model
  // constructor): its parts from now on, the state kept for them. Const (the views and state
  // are mutable) because the const accessors must not see what is gone either.
  void follow() const {
    if (!binding_ || binding_->version == seen_) return;
    const ArenaBinding& b = *binding_;
    params_ = b.params;
    grads_ = b.grads;
    if (!b.parts.empty() && !compact_) {
      // A state made for the whole arenas keeps this rank's parts; one never made (or made for
      // a model built without arenas, empty) starts at the parts' size.
      if (!state_.made() || state_.arena_elements() != b.whole)
        state_ = StateArenas<Exec, Rule::states>(Rule::state_names(), b.whole, params_.dtype,
                                                 Rule::uses_state(opt_));
      state_.shard(exec_.get(), b.parts, Rule::labels.shard_state);
      arena_elements_ = b.whole;
      compact_ = true;
      compact_parts_.clear();
      for (const auto& part : b.parts)
        if (part.second) compact_parts_.push_back(part);
    }
    seen_ = b.version;
  }
  template <class T>
  void run(std::size_t offset, std::size_t at, std::size_t count,
           const typename Rule::params_type& h) {
    Exec& e = exec_.get();
    std::array<T*, Rule::states> state{};
    for (std::size_t i = 0; i < Rule::states; ++i) {
      T* arena = static_cast<T*>(state_.data(e, i));
      state[i] = arena ? arena + at : nullptr;
    }
    Rule::queue(e, static_cast<T*>(params_.data) + offset,
                static_cast<const T*>(grads_.data) + offset, state, count, h);
  }

  ExecHolder<Exec> exec_;
  // What follow() replaces is mutable: see there.
  mutable BufferView params_, grads_;
  Schedule schedule_;
  options_type opt_;
  mutable StateArenas<Exec, Rule::states> state_;  // made on first use
  mutable std::size_t arena_elements_ = 0;  // of the whole arenas (hold_parts: more than held)
  mutable bool compact_ = false;            // the arenas hold compact_parts_ (hold_parts)
  mutable StateShards::Parts compact_parts_;
  std::shared_ptr<const ArenaBinding> binding_;  // the model's arenas (made from a model)
  mutable std::uint64_t seen_ = 0;               // binding_'s version the views are of
  std::int64_t step_ = 0;
};

}  // namespace detail
}  // namespace dtrain
