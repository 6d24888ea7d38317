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
  /// The algorithm the plan runs (automatic already resolved).
  AllreduceAlgorithm algorithm() const noexcept { return impl_->spec().algo; }

 private:
  detail::CommState<Transport>* state() const {
    DTRAIN_REQUIRE(impl_, "CollectivePlan", "empty plan (default-constructed or moved from)");
    return impl_->state();
  }
  std::shared_ptr<detail::PlanImpl<Transport>> impl_;
};

}  // namespace dtrain
