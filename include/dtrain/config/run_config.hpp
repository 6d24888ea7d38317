// SPDX-License-Identifier: BSD-3-Clause
// dtrain: one description of a training run (model, loss, optimizer and schedule, gradient
// sync, checkpoints, seed) read from a YAML file (JSON is YAML too). Plain data: the library's
// own descriptions (LayerSpec, Schedule, SgdOptions, AdamWOptions, FullyShardedOptions,
// CheckpointOptions) hold the values, checked by their own constructors; <dtrain/config/build.hpp>
// turns it into a model and an optimizer. Every key is documented in docs/configuration.md.
// Needs the `config` component (dtrain::config, yaml-cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/ckpt/checkpoint_options.hpp>
#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/model/layers.hpp>
#include <dtrain/model/loss.hpp>
#include <dtrain/optim/adamw.hpp>
#include <dtrain/optim/schedule.hpp>
#include <dtrain/optim/sgd.hpp>

namespace dtrain {

/// Which optimizer a run uses.
enum class OptimizerKind : unsigned char { sgd, adamw };

/// The optimizer of a run: its kind, the hyper-parameters of that kind (the other kind's are
/// left at their defaults), the learning-rate schedule and gradient clipping. Plain data.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  Schedule schedule = Schedule::constant(1e-3);
  SgdOptions sgd;
  AdamWOptions adamw;
  /// Greater than 0: scale the averaged gradients to at most this global L2 norm before each
  /// update (clip_grad_norm / GradNormClipper; FullyShardedOptions::max_grad_norm when fully
  /// sharded). 0: no clipping.
  double clip_grad_norm = 0;
};

/// How gradients are reconciled across ranks: `replicated` (GradientSync, every rank updates
/// every parameter), `sharded` (GradientSync::shard_updates: each rank updates its part of the
/// parameters and holds that part of the optimizer state), `fully_sharded` (FullyShardedSync:
/// parameters, gradients and optimizer state in parts).
enum class SyncMode : unsigned char { replicated, sharded, fully_sharded };

/// Gradient reconciliation of a run. Plain data.
struct SyncConfig {
  SyncMode mode = SyncMode::replicated;
  /// GradientSync bucket size (replicated and sharded modes).
  std::size_t bucket_bytes = 4194304;
  /// All-reduce algorithm of the buckets.
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::automatic;
  /// Bitwise reproducible reductions (CommConfig::reproducible for the run's communicator).
  bool reproducible = false;
  /// fully_sharded mode: unit_bytes, buffers, prefetch (unit_starts and max_grad_norm are not
  /// read from a file; max_grad_norm comes from OptimizerConfig::clip_grad_norm).
  FullyShardedOptions fully_sharded;
};

/// Checkpoints of a run: the run directory (empty: no checkpoints) and the Checkpointer's
/// settings, node-local levels included. Plain data.
struct CheckpointConfig {
  std::string directory;
  CheckpointOptions options;
};

/// A whole run, as read from a file or built by hand. Every field has the value a file may omit
/// (except model.layers, which a file must give). Plain data, copyable.
struct RunConfig {
  /// The file's path ("<text>" for parse_run_config without a source).
  std::string source = "<text>";
  /// The file's exact text: what checkpoints record as the run's description.
  std::string text;
  /// Seed of the model's initialisation, the sampler and dropout.
  std::uint64_t seed = 0;
  /// The model: begins with Input{...} (one channels-first sample, C order) unless the first
  /// layer fixes a flat input.
  std::vector<LayerSpec> layers;
  Loss loss = Loss::softmax_cross_entropy;
  /// Scalar type of the model and its optimizer: DType::f32 or DType::f64.
  DType dtype = DType::f32;
  OptimizerConfig optimizer;
  SyncConfig sync;
  CheckpointConfig checkpoint;
};

/// Reads the run description in `path` (YAML or JSON). Local, blocking. Throws IoError when the
/// file cannot be read, InvalidArgument on malformed YAML, an unknown key, a wrong type, a bad
/// value or a missing required key: the message names the file, the key path (e.g.
/// `model.layers[3].conv.stride`), the line, what was found and what was expected.
inline RunConfig read_run_config(const std::string& path);

/// The same from text; `source` names it in errors and in RunConfig::source.
inline RunConfig parse_run_config(const std::string& text, const std::string& source = "<text>");

/// The run description a checkpoint records (`dtrain::named("run_config", run)` beside the model):
/// saves RunConfig::source and RunConfig::text; restoring a checkpoint whose text differs throws
/// InvalidArgument naming both sources. Name it first in save and restore calls so the check
/// runs before any other object is loaded. The RunConfig is never modified by a restore.
template <>
struct serializer<RunConfig> {
  template <class V>
  static void visit(V& v, RunConfig& run) {
    if (!v.loading()) {
      v.scalar("source", run.source);
      v.scalar("text", run.text);
      return;
    }
    std::string source = run.source, text = run.text;
    v.scalar("source", source);
    v.scalar("text", text);
    DTRAIN_REQUIRE(text == run.text, "checkpoint restore",
                   "the checkpoint was written by the run described in "
                       << source << ", which differs from this run's description " << run.source
                       << "; restore it with the same description or start a new run directory");
  }
};

}  // namespace dtrain

#include <dtrain/config/detail/run_config_reader.hpp>
