// SPDX-License-Identifier: BSD-3-Clause
// dtrain: shared checks and helpers of the optimizers.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/optim/schedule.hpp>

namespace dtrain {
namespace detail {

inline void check_param_grad(const BufferView& params, const BufferView& grads, const char* op,
                             Space space = Space::host) {
  DTRAIN_REQUIRE(params.dtype == grads.dtype && params.count == grads.count, op,
                 "parameters " << name_of(params.dtype) << "[" << params.count << "] and gradients "
                               << name_of(grads.dtype) << "[" << grads.count << "] differ");
  DTRAIN_REQUIRE(params.dtype == DType::f32 || params.dtype == DType::f64, op,
                 "optimizers update f32 or f64, not " << name_of(params.dtype));
  DTRAIN_REQUIRE(params.space == space && grads.space == space, op,
                 "the execution policy runs on " << name_of(space) << " memory but was given "
                                                 << name_of(params.space) << " parameters and "
                                                 << name_of(grads.space) << " gradients");
  DTRAIN_REQUIRE(params.data != nullptr || params.count == 0, op, "null parameter buffer");
}

// A model's policy when it has one (Sequential::exec()), else the optimizer's own.
template <class M, class = void>
struct has_exec : std::false_type {};
template <class M>
struct has_exec<M, std::void_t<decltype(std::declval<M&>().exec())>> : std::true_type {};

// Holds the policy an optimizer runs on: borrowed, or its own when made from an allocator.
template <class Exec>
class ExecHolder {
 public:
  explicit ExecHolder(Exec& e) noexcept : exec_(&e) {}
  explicit ExecHolder(std::unique_ptr<Exec> own) noexcept
      : own_(std::move(own)), exec_(own_.get()) {}
  template <class M>
  static ExecHolder of_model(M& model) {
    if constexpr (has_exec<M>::value) {
      static_assert(std::is_same_v<std::decay_t<decltype(model.exec())>, Exec>,
                    "the optimizer's execution policy differs from the model's");
      return ExecHolder(model.exec());
    } else {
      return ExecHolder(std::make_unique<Exec>());
    }
  }
  Exec& get() const noexcept { return *exec_; }

 private:
  std::unique_ptr<Exec> own_;
  Exec* exec_;
};

// Queues the zeroing of an f32 or f64 tensor of exec memory (its allocator need not zero it).
template <class Exec>
void fill_zero(Exec& exec, Tensor& t) {
  if (t.dtype() == DType::f32)
    exec.fill(exec.compute_stream(), static_cast<float*>(t.raw()), t.size(), 0.0f);
  else
    exec.fill(exec.compute_stream(), static_cast<double*>(t.raw()), t.size(), 0.0);
}

// Elements [offset, offset + count) of an arena of n; throws InvalidArgument otherwise.
inline void check_range(std::size_t offset, std::size_t count, std::size_t n, const char* op) {
  DTRAIN_REQUIRE(offset <= n && count <= n - offset, op,
                 "range [" << offset << ", " << offset + count << ") outside the arena of " << n
                           << " elements");
}

/// Whether a visit sees a sharded state as this rank's parts: a visitor that takes parts (the
/// checkpointer's save, and the check pass of its restore) while the state is kept in parts
/// and the visitor is not loading, or loads parts (visitor_loads_parts: the checkpointer's
/// restore). Other visitors see the whole state, or are refused while it is partial
/// (check_state_whole); another loading one fills the whole state, or, while it is sharded,
/// this rank's parts of it.
template <class V>
bool visits_parts([[maybe_unused]] const V& v, [[maybe_unused]] bool sharded) {
  if constexpr (visitor_takes_parts<V>::value)
    return sharded && (!v.loading() || visitor_loads_parts(v));
  else
    return false;
}

// The state a checkpoint reads or writes must be whole on this rank, not only its parts of it.
inline void check_state_whole(bool partial, const char* op) {
  DTRAIN_REQUIRE(!partial, op,
                 "the optimizer state is current only in this rank's parts (sharded updates); "
                 "call GradientSync::gather_state(optimizer) on every rank first");
}

template <class M, class = void>
struct has_arenas : std::false_type {};
template <class M>
struct has_arenas<M, std::void_t<decltype(BufferView(std::declval<M&>().parameters())),
                                 decltype(BufferView(std::declval<M&>().gradients()))>>
    : std::true_type {};

// The schedule is checkpointed as its description. Loading a description that differs is allowed
// (a run may be resumed with a new schedule on purpose) but worth a warning; the optimizer keeps
// the schedule it was constructed with.
template <class V>
void visit_schedule(V& v, const Schedule& schedule, const char* who) {
  std::string saved = schedule.describe();
  const std::string current = saved;
  v.scalar("schedule", saved);
  if (v.loading() && !saved.empty() && saved != current)
    DTRAIN_LOG(warn, who << ": checkpoint was written with schedule " << saved
                         << ", continuing with " << current);
}

}  // namespace detail
}  // namespace dtrain
