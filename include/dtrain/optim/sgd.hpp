// SPDX-License-Identifier: BSD-3-Clause
// dtrain: stochastic gradient descent with momentum, Nesterov momentum and weight decay.
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

/// SGD hyper-parameters (PyTorch semantics: weight decay is added to the gradient; the momentum
/// buffer starts as the first gradient; dampening scales later gradients).
struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

namespace detail {
/// SGD's part of an element-wise optimizer (see ElementwiseOptimizer): one state arena, the
/// momentum buffer, used when momentum is.
struct SgdRule {
  using options_type = SgdOptions;
  using params_type = host::SgdParams;
  static constexpr std::size_t states = 1;
  static constexpr OptimizerLabels labels{"Sgd", "Sgd::update", "Sgd::shard_state",
                                          "Sgd::unshard_state", "Sgd::visit_state"};
  static std::array<const char*, states> state_names() noexcept { return {"momentum"}; }
  static bool uses_state(const SgdOptions& options) noexcept { return options.momentum != 0.0; }
  static void check_options(const SgdOptions& options) {
    DTRAIN_REQUIRE(!(options.nesterov && (options.momentum <= 0 || options.dampening != 0)), "Sgd",
                   "Nesterov momentum needs momentum > 0 and dampening 0");
    DTRAIN_REQUIRE(options.momentum >= 0 && options.weight_decay >= 0, "Sgd",
                   "momentum and weight decay must be non-negative");
  }
  static host::SgdParams params(const SgdOptions& options, double lr, std::int64_t step) noexcept {
    host::SgdParams h;
    h.lr = lr;
    h.momentum = options.momentum;
    h.dampening = options.dampening;
    h.weight_decay = options.weight_decay;
    h.nesterov = options.nesterov;
    h.first_step = step == 0;
    return h;
  }
  template <class Exec, class T>
  static void queue(Exec& e, T* p, const T* g, const std::array<T*, states>& state,
                    std::size_t count, const host::SgdParams& h) {
    e.sgd_update(e.compute_stream(), p, g, state[0], count, h);
  }
};
}  // namespace detail

/// SGD over a parameter arena and its gradient arena (f32 or f64, exec memory of policy Exec;
/// both views are borrowed and must outlive the optimizer). Every rank applies the same step to
/// the same averaged gradients, so replicas stay identical. The momentum buffer is exec memory
/// from the policy's allocator, made (zeroed) on first use: a state sharded before then
/// (shard_state, GradientSync::shard_updates) is never whole-sized. Updates are queued on the
/// policy's compute stream. Its one state arena, checkpointed as "momentum" (when momentum is
/// used), and the members it shares with AdamW are those of detail::ElementwiseOptimizer. Local
/// object, not thread-safe.
template <class Exec = HostExec>
class BasicSgd : public detail::ElementwiseOptimizer<Exec, detail::SgdRule> {
  static_assert(detail::check_exec_policy<Exec>(), "BasicSgd needs an execution policy");

 public:
  /// BasicSgd(exec, params, grads, schedule, options = {}): runs on `exec` (borrowed).
  /// BasicSgd(params, grads, schedule, options = {}, alloc = default_allocator()): on a policy
  /// of its own made from `alloc`. BasicSgd(model, schedule, options = {}): on the arenas of a
  /// model (e.g. Sequential), on its policy when it has one.
  using detail::ElementwiseOptimizer<Exec, detail::SgdRule>::ElementwiseOptimizer;
};

/// SGD on the host.
using Sgd = BasicSgd<HostExec>;

}  // namespace dtrain
