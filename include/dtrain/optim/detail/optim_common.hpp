// dtrain: shared checks and helpers of the optimizers.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/optim/schedule.hpp>

namespace dtrain {
namespace detail {

inline void check_param_grad(const BufferView& params, const BufferView& grads, const char* op) {
  DTRAIN_REQUIRE(params.dtype == grads.dtype && params.count == grads.count, op,
                 "parameters " << name_of(params.dtype) << "[" << params.count << "] and gradients "
                               << name_of(grads.dtype) << "[" << grads.count << "] differ");
  DTRAIN_REQUIRE(params.dtype == DType::f32 || params.dtype == DType::f64, op,
                 "host optimizers update f32 or f64, not " << name_of(params.dtype));
  DTRAIN_REQUIRE(params.space == Space::host && grads.space == Space::host, op,
                 "host optimizer given " << name_of(params.space) << " memory");
  DTRAIN_REQUIRE(params.data != nullptr || params.count == 0, op, "null parameter buffer");
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
