// SPDX-License-Identifier: BSD-3-Clause
// The options every training example shares (examples only, not part of the library): the model
// and schedule (--epochs --max-steps --batch --hidden --lr --seed), the run directory and what it
// holds (--run-dir --ckpt-every --ckpt-strategy --ckpt-local-dir --stop-after --override-schedule
// --log-every --json-summary --no-plot), --target, --bucket-kib, --step and --device. A program
// adds its own options (its data) to the same CLI::App and parses them all at once with
// parse_train_options(), which also checks combinations and that every rank got the same options.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/cli_mpi.hpp"
#include "common/device.hpp"

namespace dtrain_cli {

/// The shared options' values; a program sets its own defaults before add_train_options().
struct TrainOptions {
  std::string run_dir;
  std::string json_summary;
  int epochs = 2;
  std::int64_t batch = 64;
  std::int64_t hidden = 256;
  double lr = 2e-3;
  std::int64_t max_steps = -1;
  std::uint64_t seed = 1;
  std::int64_t ckpt_every = 0;
  std::int64_t log_every = 100;
  std::int64_t stop_after = -1;
  double target = 0.80;
  std::int64_t bucket_kib = 256;
  bool override_schedule = false;
  bool plot = true;
  std::string device = "auto";
  std::string ckpt_strategy = "automatic";
  std::string ckpt_local_dir;
  std::string step_mode = "separate";
};

/// Adds the shared options to `app`, bound to `o` (its current values are the defaults).
inline void add_train_options(CLI::App& app, TrainOptions& o) {
  add_run_dir(app, o.run_dir);
  add_json_summary(app, o.json_summary);
  add_epochs(app, o.epochs);
  add_batch(app, o.batch);
  add_hidden(app, o.hidden);
  add_lr(app, o.lr);
  add_max_steps(app, o.max_steps);
  add_seed(app, o.seed);
  add_int(app, "--ckpt-every", o.ckpt_every,
          "save a checkpoint every N steps (0: only at the end; needs --run-dir)", 0, kMaxInt);
  add_int(app, "--log-every", o.log_every,
          "steps per progress line, metrics row and per-rank timing row", 1, 1000000);
  add_int(app, "--stop-after", o.stop_after,
          "end this invocation after N steps with a checkpoint, as when an allocation ends; a "
          "restart with the same options continues (-1: run to the end)",
          -1, kMaxInt);
  add_real(app, "--target", o.target, "exit 1 unless the final test accuracy reaches this", 0.0,
           1.0);
  add_int(app, "--bucket-kib", o.bucket_kib, "gradient bucket size in KiB", 1, 1 << 20);
  app.add_flag("--override-schedule", o.override_schedule,
               "on restart, continue under the schedule these options give even when it differs "
               "from the checkpoint's");
  app.add_flag("!--no-plot", o.plot,
               "do not name the command that draws RUN_DIR/metrics.png (scripts/plot-metrics) at "
               "the end; scripts/demo then draws none");
  add_device(app, o.device);
  app.add_option("--ckpt-strategy", o.ckpt_strategy,
                 "who writes a checkpoint: rank0 (rank 0 alone; what automatic chooses), "
                 "parallel_rank0 or parallel_slices (one MPI-IO file; a sharded step's AdamW "
                 "moments written in place by every rank, never assembled on rank 0)")
      ->check(CLI::IsMember({"automatic", "rank0", "parallel_rank0", "parallel_slices"}))
      ->capture_default_str();
  app.add_option("--ckpt-local-dir", o.ckpt_local_dir,
                 "multi-level checkpoints: each save goes to this node-local directory (the same "
                 "path on every node: /dev/shm/..., local NVMe), a copy to the next node's, and in "
                 "the background to --run-dir; a restart takes the newest copy of this run at any "
                 "level. DTRAIN_CKPT_LOCAL_DIR (the batch script's) overrides it");
  app.add_option("--step", o.step_mode,
                 "how the AdamW step meets the gradient sync: separate (every bucket averaged, "
                 "then one step), fused (each bucket updated as soon as its average arrives), "
                 "sharded (each bucket reduce-scattered, each rank updating its 1/p part and "
                 "keeping the moments of that part only, the parameters all-gathered); the same "
                 "parameters in all three (on 2 ranks, or with DTRAIN_COMM_REPRODUCIBLE=1, bit "
                 "for bit). sharded needs host gradients (--device cpu)")
      ->check(CLI::IsMember({"separate", "fused", "sharded"}))
      ->capture_default_str();
}

/// A combination of the shared options that no single option's range rules out, or nullptr.
inline const char* train_options_problem(const TrainOptions& o) {
  if (o.max_steps == 0) return "--max-steps 0 leaves nothing to train (-1: no limit)";
  if (o.ckpt_every > 0 && o.run_dir.empty()) return "--ckpt-every needs --run-dir";
  if (o.stop_after >= 0 && o.run_dir.empty()) return "--stop-after needs --run-dir";
  if (!o.ckpt_local_dir.empty() && o.run_dir.empty()) return "--ckpt-local-dir needs --run-dir";
  if (o.stop_after == 0) return "--stop-after 0 leaves nothing to train (-1: no limit)";
  return nullptr;
}

/// Collective over `comm` (run_parser_mpi, then options_mismatch). Parses argv on every rank and
/// returns -1 to continue or the exit code every rank returns: 0 after --help, 2 after a bad
/// option or a bad combination (train_options_problem), 1 when the ranks were given different
/// options. Rank 0 prints the problem as "<program>: <problem>" on stderr.
inline int parse_train_options(CLI::App& app, int argc, char** argv, const TrainOptions& o,
                               const char* program, MPI_Comm comm = MPI_COMM_WORLD) {
  const int code = run_parser_mpi(app, argc, argv, comm);
  if (code >= 0) return code;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string mismatch = options_mismatch(app, comm);
  const char* problem = mismatch.empty() ? train_options_problem(o) : mismatch.c_str();
  if (!problem) return -1;
  if (rank == 0) std::fprintf(stderr, "%s: %s\n", program, problem);
  return mismatch.empty() ? 2 : 1;
}

}  // namespace dtrain_cli
