// SPDX-License-Identifier: BSD-3-Clause
// dtrain: a collective planned once on fixed buffers and executed many times.
#pragma once

#include <memory>
#include <utility>

#include <dtrain/comm/collective_handle.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>

namespace dtrain {

namespace detail {
/// Runs `j` now on the caller's thread when nothing is queued before it, else queues it behind
/// the started collectives (issue order is what every rank agrees on) and waits.
template <class Transport>
void execute_in_order(CommState<Transport>& st, Job& j) {
  if (st.engine.idle()) {
    j.run();
  } else {
    st.engine.submit(j);
    st.engine.wait(j);
  }
}
}  // namespace detail

/// A collective bound to fixed buffers, sizes, operation and algorithm, made by
/// Communicator::plan_allreduce / plan_broadcast / plan_reduce_scatter / plan_allgather.
/// Scratch memory, request slots, segment layout and transport registrations are set up at
/// construction: execute() and start() allocate nothing. Every rank must execute its plans in the
/// same order as its other collectives. Not thread-safe; the buffers stay owned by the caller and
/// must outlive the plan. Move-only; the communicator must outlive it.
template <class Transport>
class CollectivePlan {
 public:
  CollectivePlan() = default;
  explicit CollectivePlan(std::shared_ptr<detail::PlanImpl<Transport>> impl)
      : impl_(std::move(impl)) {}

  /// Collective, blocking: runs the collective once (after any started ones).
  void execute() { detail::execute_in_order(*state(), *impl_); }

  /// Collective, non-blocking: queues the collective and returns at once. The buffers must not
  /// be touched until the handle completes; a plan runs at most once at a time and must outlive
  /// the handle.
  CollectiveHandle start() {
    state()->engine.submit(*impl_);
    return CollectiveHandle(impl_.get());
  }

  /// True once constructed by a communicator.
  bool valid() const noexcept { return impl_ != nullptr; }
  /// The algorithm the plan runs (automatic already resolved; for an adaptive plan, the one in
  /// use now, which may have changed since construction). This and the three below read the
  /// plan's state: not while a start()ed execution may still run.
  AllreduceAlgorithm algorithm() const noexcept { return impl_->algorithm_in_use(); }
  /// The algorithm an adaptive `automatic` plan checks itself against (CommConfig::adaptive),
  /// or `automatic` when it keeps its algorithm for good.
  AllreduceAlgorithm runner_up() const noexcept {
    const detail::AdaptSchedule* a = impl_->adapt_schedule();
    if (!a) return AllreduceAlgorithm::automatic;
    return a->swapped() ? impl_->spec().algo : impl_->spec().runner_up;
  }
  /// How often an adaptive plan changed its algorithm so far (0 for other plans).
  int algorithm_changes() const noexcept {
    const detail::AdaptSchedule* a = impl_->adapt_schedule();
    return a ? a->switches() : 0;
  }
  /// Checking windows an adaptive plan has closed so far (0 for other plans).
  int algorithm_checks() const noexcept {
    const detail::AdaptSchedule* a = impl_->adapt_schedule();
    return a ? a->windows() : 0;
  }

 private:
  detail::CommState<Transport>* state() const {
    DTRAIN_REQUIRE(impl_, "CollectivePlan", "empty plan (default-constructed or moved from)");
    return impl_->state();
  }
  std::shared_ptr<detail::PlanImpl<Transport>> impl_;
};

}  // namespace dtrain
