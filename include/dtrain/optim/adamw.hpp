// SPDX-License-Identifier: BSD-3-Clause
// dtrain: AdamW (Adam with decoupled weight decay and bias correction).
#pragma once

#include <array>
#include <cstddef>
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
#include <dtrain/optim/detail/elementwise_optimizer.hpp>
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

namespace detail {
/// AdamW's part of an element-wise optimizer (see ElementwiseOptimizer): two state arenas, the
/// first and second moments.
struct AdamWRule {
  using options_type = AdamWOptions;
  using params_type = host::AdamWParams;
  static constexpr std::size_t states = 2;
  static constexpr OptimizerLabels labels{"AdamW", "AdamW::update", "AdamW::shard_state",
                                          "AdamW::unshard_state", "AdamW::visit_state"};
  static std::array<const char*, states> state_names() noexcept {
    return {"exp_avg", "exp_avg_sq"};
  }
  static bool uses_state(const AdamWOptions&) noexcept { return true; }
  static void check_options(const AdamWOptions& options) {
    DTRAIN_REQUIRE(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                       options.beta2 < 1 && options.eps > 0 && options.weight_decay >= 0,
                   "AdamW",
                   "need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got beta1="
                       << options.beta1 << " beta2=" << options.beta2 << " eps=" << options.eps
                       << " weight_decay=" << options.weight_decay);
  }
  static host::AdamWParams params(const AdamWOptions& options, double lr,
                                  std::int64_t step) noexcept {
    host::AdamWParams h;
    h.lr = lr;
    h.beta1 = options.beta1;
    h.beta2 = options.beta2;
    h.eps = options.eps;
    h.weight_decay = options.weight_decay;
    h.step = step + 1;
    return h;
  }
  template <class Exec, class T>
  static void queue(Exec& e, T* p, const T* g, const std::array<T*, states>& state,
                    std::size_t count, const host::AdamWParams& h) {
    e.adamw_update(e.compute_stream(), p, g, state[0], state[1], count, h);
  }
};
}  // namespace detail

/// AdamW over a parameter arena and its gradient arena (f32 or f64, exec memory of policy Exec;
/// both views borrowed, they must outlive the optimizer). Update, with t = step_count() + 1:
///   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
///   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
/// The moments are exec memory from the policy's allocator, made (zeroed) on first use: a state
/// sharded before then (shard_state, GradientSync::shard_updates) is never whole-sized. Updates
/// are queued on the policy's compute stream. Its state arenas, checkpointed as "exp_avg" and
/// "exp_avg_sq", and the members it shares with SGD are those of detail::ElementwiseOptimizer.
/// Local object, not thread-safe.
template <class Exec = HostExec>
class BasicAdamW : public detail::ElementwiseOptimizer<Exec, detail::AdamWRule> {
  static_assert(detail::check_exec_policy<Exec>(), "BasicAdamW needs an execution policy");

 public:
  /// BasicAdamW(exec, params, grads, schedule, options = {}): runs on `exec` (borrowed).
  /// BasicAdamW(params, grads, schedule, options = {}, alloc = default_allocator()): on a policy
  /// of its own made from `alloc`. BasicAdamW(model, schedule, options = {}): on the arenas of a
  /// model (e.g. Sequential), on its policy when it has one.
  using detail::ElementwiseOptimizer<Exec, detail::AdamWRule>::ElementwiseOptimizer;

  /// First and second moments (exec memory; the parameter arena's layout, or while sharded its
  /// parts back to back). Makes them (zeros) if not made yet.
  BufferView exp_avg() const { return this->state_view(0); }
  BufferView exp_avg_sq() const { return this->state_view(1); }
};

/// AdamW on the host.
using AdamW = BasicAdamW<HostExec>;

}  // namespace dtrain
