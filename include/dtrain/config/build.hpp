// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the library's own objects from a run description (RunConfig): the model on any
// execution policy, the optimizer with its schedule, and the settings of the communicator, the
// fully sharded sync and the checkpointer. A C++ user reads the same file the C and Fortran
// bindings read and gets the same objects they would build by hand:
//
//     const dtrain::RunConfig run = dtrain::read_run_config("run.yaml");
//     auto model = dtrain::make_model<float>(run);
//     auto opt = dtrain::make_optimizer<dtrain::AdamW>(model, run.optimizer);
//
// Needs the `config` component (dtrain::config).
#pragma once

#include <string>
#include <type_traits>
#include <variant>

#include <dtrain/ckpt/checkpoint_options.hpp>
#include <dtrain/comm/comm_config.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/config/run_config.hpp>
#include <dtrain/core/allocator.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/model/sequential.hpp>
#include <dtrain/optim/adamw.hpp>
#include <dtrain/optim/sgd.hpp>

namespace dtrain {

namespace detail {
inline void check_model_dtype(const RunConfig& run, DType t, const char* op) {
  DTRAIN_REQUIRE(run.dtype == t, op,
                 run.source << " describes an " << name_of(run.dtype) << " model (model.dtype), "
                            << "asked for " << name_of(t));
}
// The model's own shape checks, with the file they came from.
template <class F>
auto build_model(const RunConfig& run, F&& make) {
  try {
    return make();
  } catch (const InvalidArgument& e) {
    std::string inner = e.what();
    const std::string prefix = "dtrain: rank ";
    if (inner.compare(0, prefix.size(), prefix) == 0) {
      const auto colon = inner.find(": ", prefix.size());
      if (colon != std::string::npos) inner.erase(0, colon + 2);
    }
    // Sequential numbers its layers after the Input entry; say so where the file has one.
    const bool input = !run.layers.empty() && std::holds_alternative<Input>(run.layers.front());
    raise<InvalidArgument>("make_model",
                           run.source + ": model.layers: " + inner +
                               (input ? " (layer numbers count from the entry after input)" : ""));
  }
}
}  // namespace detail

/// The model `run` describes, over scalar T (which must be run.dtype's) on policy `exec`
/// (borrowed: it must outlive the model), initialised with init(run.seed). Local, blocking.
/// Throws InvalidArgument naming the file when the layers do not fit together (the checks of
/// BasicSequential) or T is not the described dtype.
template <class T, class Exec>
BasicSequential<T, Exec> make_model(const RunConfig& run, Exec& exec) {
  detail::check_model_dtype(run, dtype_of_v<T>, "make_model");
  BasicSequential<T, Exec> model =
      detail::build_model(run, [&] { return BasicSequential<T, Exec>(run.layers, exec); });
  model.init(run.seed);
  return model;
}

/// The same on a policy of its own made from `alloc` (HostExec by default: host memory from
/// `alloc`, which must outlive the model).
template <class T, class Exec = HostExec,
          class = std::enable_if_t<std::is_constructible_v<Exec, Allocator&>>>
BasicSequential<T, Exec> make_model(const RunConfig& run, Allocator& alloc = default_allocator()) {
  detail::check_model_dtype(run, dtype_of_v<T>, "make_model");
  BasicSequential<T, Exec> model =
      detail::build_model(run, [&] { return BasicSequential<T, Exec>(run.layers, alloc); });
  model.init(run.seed);
  return model;
}

/// The optimizer `o` describes, of type Opt (BasicSgd<Exec> or BasicAdamW<Exec>, which must be
/// o.kind), on the arenas of `model` (borrowed: it must outlive the optimizer), with o.schedule
/// and o's hyper-parameters for that kind. Gradient clipping (o.clip_grad_norm) is the training
/// loop's: clip_grad_norm / GradNormClipper after the all-reduce, or fully_sharded_options.
/// Local. Throws InvalidArgument when Opt is not the described kind.
template <class Opt, class Model>
Opt make_optimizer(Model& model, const OptimizerConfig& o) {
  using Exec = typename Opt::exec_type;
  if constexpr (std::is_same_v<Opt, BasicSgd<Exec>>) {
    DTRAIN_REQUIRE(o.kind == OptimizerKind::sgd, "make_optimizer",
                   "the run describes optimizer.kind adamw, asked for SGD");
    return Opt(model, o.schedule, o.sgd);
  } else {
    static_assert(std::is_same_v<Opt, BasicAdamW<Exec>>,
                  "make_optimizer builds BasicSgd<Exec> or BasicAdamW<Exec>");
    DTRAIN_REQUIRE(o.kind == OptimizerKind::adamw, "make_optimizer",
                   "the run describes optimizer.kind sgd, asked for AdamW");
    return Opt(model, o.schedule, o.adamw);
  }
}

/// `base` with the run's reproducible mode (sync.reproducible) switched on when it asks for it.
inline CommConfig comm_config(const RunConfig& run, CommConfig base = CommConfig::from_env()) {
  base.reproducible = base.reproducible || run.sync.reproducible;
  return base;
}

/// FullyShardedSync's options for the run: sync.fully_sharded with the optimizer's clipping norm.
inline FullyShardedOptions fully_sharded_options(const RunConfig& run) {
  FullyShardedOptions f = run.sync.fully_sharded;
  f.max_grad_norm = run.optimizer.clip_grad_norm;
  return f;
}

/// The Checkpointer's options for the run (checkpoint.options), recording the run's text in
/// every file (CheckpointOptions::config). Save and restore `dtrain::named("run_config", run)` too
/// so that a restore under another description fails (see serializer<RunConfig>).
inline CheckpointOptions checkpoint_options(const RunConfig& run) {
  CheckpointOptions c = run.checkpoint.options;
  c.config = run.text;
  return c;
}

}  // namespace dtrain
