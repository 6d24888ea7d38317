// SPDX-License-Identifier: BSD-3-Clause
// A training run's plan, its restart checks and its closing report (examples only, not part of
// the library). The plan is stored in every checkpoint next to the model ("run/..."), so that a
// restart can tell whether its options continue the same model and schedule:
//   - another --hidden or --seed trains another model: refused;
//   - another --lr, --epochs, --max-steps or --batch gives another schedule: refused unless
//     --override-schedule, which continues from the checkpoint under the new options' schedule;
//   - another number of ranks continues the epoch where it stopped, the schedule unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include <dtrain/ckpt/checkpoint_options.hpp>
#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/optim/schedule.hpp>
#include <dtrain/train/agreed.hpp>
#include <dtrain/train/step_meter.hpp>

#include "common/train_options.hpp"

namespace dtrain_cli {

/// What a run was started with: the schedule's parameters and the options that decide it.
/// Outside an unnamed namespace: nvcc warns about the checkpoint visitor's probe of visit_state
/// in a type with internal linkage.
struct RunRecord {
  double lr = 0, min_lr = 0;
  std::int64_t epochs = 0, max_steps = -1, batch = 0, hidden = 0, seed = 0, world_size = 0;
  std::int64_t warmup = 0, total_steps = 0;
  std::string schedule;

  dtrain::Schedule make_schedule() const {
    return dtrain::Schedule::warmup_cosine(lr, warmup, total_steps, min_lr);
  }
  /// A schedule that ends at `total` steps (at least 2): warm-up over a tenth, at most 100 steps,
  /// then a cosine decay to 5% of the peak.
  void plan(std::int64_t total) {
    total_steps = std::max<std::int64_t>(total, 2);
    warmup = std::min<std::int64_t>(100, total_steps / 10 + 1);
    schedule = make_schedule().describe();
  }
  template <class V>
  void visit_state(V& v) {
    v.scalar("lr", lr);
    v.scalar("min_lr", min_lr);
    v.scalar("epochs", epochs);
    v.scalar("max_steps", max_steps);
    v.scalar("batch", batch);
    v.scalar("hidden", hidden);
    v.scalar("seed", seed);
    v.scalar("world_size", world_size);
    v.scalar("warmup_steps", warmup);
    v.scalar("total_steps", total_steps);
    v.scalar("schedule", schedule);
  }
};

/// A run's plan: what it saves, what it resumed from, where it ends.
struct RunPlan {
  RunRecord record;                     ///< saved in this run's checkpoints as "run"
  RunRecord saved;                      ///< the record of the checkpoint it resumes from
  std::optional<std::int64_t> resumed;  ///< the step it resumes from (none: a fresh run)
  std::int64_t total_steps = 0;         ///< the step at which the run is complete
  std::string note;                     ///< how a resumed run differs from the one it continues

  std::int64_t cap(std::int64_t steps) const {
    return record.max_steps >= 0 ? std::min(steps, record.max_steps) : steps;
  }
};

/// Local. The plan of a fresh run of `o` on `world` ranks, `steps_per_epoch` steps per epoch.
inline RunPlan plan_run(const TrainOptions& o, std::int64_t steps_per_epoch, int world) {
  RunPlan p;
  RunRecord& r = p.record;
  r.lr = o.lr;
  r.min_lr = o.lr * 0.05;
  r.epochs = o.epochs;
  r.max_steps = o.max_steps;
  r.batch = o.batch;
  r.hidden = o.hidden;
  r.seed = static_cast<std::int64_t>(o.seed);
  r.world_size = world;
  r.plan(p.cap(steps_per_epoch * o.epochs));
  p.total_steps = r.total_steps;
  return p;
}

/// The options of `now` that change the schedule, where they differ from `then` ("" if none).
inline std::string schedule_differences(const RunRecord& then, const RunRecord& now) {
  std::string d;
  auto add = [&](const char* name, const std::string& a, const std::string& b) {
    if (a != b) d += std::string(d.empty() ? "" : ", ") + name + " " + a + " (now " + b + ")";
  };
  auto real = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  add("--lr", real(then.lr), real(now.lr));
  add("--epochs", std::to_string(then.epochs), std::to_string(now.epochs));
  add("--max-steps", std::to_string(then.max_steps), std::to_string(now.max_steps));
  add("--batch", std::to_string(then.batch), std::to_string(now.batch));
  return d;
}

/// Collective (a checkpoint read). Reads the run record of the newest checkpoint of `ckpt`
/// (dtrain::Checkpointer) into plan.saved and sets plan.resumed; nothing else on a fresh run.
/// Throws dtrain::AgreedError (the same on every rank) when the checkpoint trains another model,
/// or follows another schedule without --override-schedule. An unchanged schedule continues as
/// saved; a changed one is noted.
template <class Ckpt>
void read_saved_run(Ckpt& ckpt, RunPlan& plan, const TrainOptions& o, const std::string& program) {
  plan.resumed = ckpt.restore_latest(dtrain::named("run", plan.saved));
  if (!plan.resumed) return;
  const RunRecord& saved = plan.saved;
  if (saved.hidden != o.hidden || saved.seed != static_cast<std::int64_t>(o.seed))
    throw dtrain::AgreedError(
        program + ": the run in " + o.run_dir + " trains a model with --hidden " +
        std::to_string(saved.hidden) + " --seed " + std::to_string(saved.seed) +
        "; this restart has --hidden " + std::to_string(o.hidden) + " --seed " +
        std::to_string(o.seed) + ". Restart with those options or choose another --run-dir.");
  const std::string diff = schedule_differences(saved, plan.record);
  if (!diff.empty() && !o.override_schedule)
    throw dtrain::AgreedError(
        program + ": the run in " + o.run_dir + " was started with " + diff + "; its schedule is " +
        saved.schedule +
        ". Restart with the original options, pass --override-schedule to continue from step " +
        std::to_string(*plan.resumed) +
        " under the new options' schedule, or choose another --run-dir.");
  if (diff.empty()) {
    plan.record.total_steps = saved.total_steps;  // the schedule continues as planned
    plan.record.warmup = saved.warmup;
    plan.record.schedule = saved.schedule;
  } else {
    plan.note = "continuing under a new schedule (--override-schedule; was " + diff + ")";
  }
}

/// Local. After the restore of a resumed run at `step`: the steps it takes are what is left of
/// the sampler's epoch at this world size, then whole epochs (a checkpoint written by another
/// number of ranks continues its epoch where it stopped). Under --override-schedule the new
/// schedule ends where this run ends. Sets plan.total_steps and the record's world size.
template <class Sampler>
void continue_run(RunPlan& plan, const TrainOptions& o, const Sampler& sampler, std::size_t batch,
                  std::int64_t steps_per_epoch, std::int64_t step, int world) {
  RunRecord& record = plan.record;
  if (plan.resumed) {
    const std::int64_t left_in_epoch =
        sampler.epoch() < o.epochs ? static_cast<std::int64_t>(sampler.remaining_batches(batch))
                                   : 0;
    const std::int64_t later =
        std::max<std::int64_t>(0, o.epochs - sampler.epoch() - 1) * steps_per_epoch;
    plan.total_steps = plan.cap(step + left_in_epoch + later);
    if (plan.saved.world_size != world && plan.note.empty())
      plan.note = "the checkpoint was written by " + std::to_string(plan.saved.world_size) +
                  " ranks: the epoch continues at sample " + std::to_string(sampler.position()) +
                  " of " + std::to_string(sampler.num_samples()) + " on " + std::to_string(world) +
                  "; the schedule keeps its " + std::to_string(record.total_steps) + " steps";
    if (record.schedule != plan.saved.schedule) record.plan(plan.total_steps);
  }
  record.world_size = world;
}

/// Local. The checkpoint options of the shared options: every --ckpt-every steps, the newest 2
/// kept (at every level), written by --ckpt-strategy, node-local first with --ckpt-local-dir;
/// `config` is stored verbatim in every file. The Checkpointer applies DTRAIN_CKPT_* over them.
inline dtrain::CheckpointOptions checkpoint_options(const TrainOptions& o, std::string config) {
  dtrain::CheckpointOptions c;
  c.every_steps = o.ckpt_every;
  c.keep_last = 2;
  for (auto s :
       {dtrain::CheckpointStrategy::automatic, dtrain::CheckpointStrategy::rank0,
        dtrain::CheckpointStrategy::parallel_rank0, dtrain::CheckpointStrategy::parallel_slices})
    if (o.ckpt_strategy == dtrain::name_of(s)) c.strategy = s;
  c.config = std::move(config);
  c.levels.local_dir = o.ckpt_local_dir;
  return c;
}

/// What `automatic` all-reduce runs per message size, as "min_bytes:algorithm" rows ("0:rd
/// 256:ring"; one row when DTRAIN_ALLREDUCE_ALGO pins it). Runs that choose differently add in
/// different orders and end on different bits (README: "Which all-reduce runs, and bit-identical
/// runs"). Collective the first time (it may calibrate): every rank calls it at the same point.
template <class Comm>
std::string allreduce_choice(Comm& comm) {
  if (comm.size() == 1) return "none (1 rank)";
  if (comm.config().reproducible) return "reproducible (every algorithm adds in rank order)";
  std::string rows;
  for (const auto& d : comm.allreduce_decisions())
    rows += (rows.empty() ? "" : " ") + std::to_string(d.min_bytes) + ":" + dtrain::name_of(d.algo);
  return rows;
}

/// Local (rank 0), before training: where a resumed run continues, and how it differs from the
/// run it continues.
template <class Sampler>
void print_resume(const RunPlan& plan, const TrainOptions& o, const Sampler& sampler,
                  std::int64_t step) {
  if (plan.resumed && step < plan.total_steps)
    std::printf("resuming from step %lld (epoch %lld, sample %llu of %llu) in %s\n",
                static_cast<long long>(step), static_cast<long long>(sampler.epoch() + 1),
                static_cast<unsigned long long>(sampler.position()),
                static_cast<unsigned long long>(sampler.num_samples()), o.run_dir.c_str());
  if (!plan.note.empty()) std::printf("%s\n", plan.note.c_str());
}

/// Local (rank 0), at the end: a run that was complete before this invocation started, or one
/// that --stop-after ended early (and how to go on).
inline void print_run_end(const RunPlan& plan, const TrainOptions& o, std::int64_t first_step,
                          std::int64_t step) {
  if (plan.resumed && first_step >= plan.total_steps)
    std::printf(
        "the run in %s is complete (step %lld of %lld); to start a fresh run, remove that "
        "directory or pass another --run-dir (scripts/demo: DTRAIN_DEMO_FRESH=1)\n",
        o.run_dir.c_str(), static_cast<long long>(step), static_cast<long long>(plan.total_steps));
  if (step < plan.total_steps)
    std::printf(
        "stopped after %lld steps as asked (--stop-after): step %lld of %lld is saved; run the "
        "same command again to continue\n",
        static_cast<long long>(step - first_step), static_cast<long long>(step),
        static_cast<long long>(plan.total_steps));
}

/// Local (rank 0). Where this rank's training time went: data, forward+backward, the wait for the
/// gradient average and the optimizer; under --step fused or sharded the updates run inside the
/// wait and share its figure.
inline void print_time_split(const dtrain::StepTimes& t, const std::string& step_mode) {
  const double tot = t.total();
  if (tot <= 0) return;
  if (step_mode == "separate")
    std::printf(
        "rank 0 time split: data %.0f%%, forward+backward %.0f%%, gradient sync wait %.0f%%, "
        "optimizer %.0f%%\n",
        100 * t.data_s / tot, 100 * t.compute_s / tot, 100 * t.sync_s / tot,
        100 * t.optimizer_s / tot);
  else
    std::printf(
        "rank 0 time split: data %.0f%%, forward+backward %.0f%%, gradient sync wait and %s "
        "updates %.0f%%\n",
        100 * t.data_s / tot, 100 * t.compute_s / tot, step_mode.c_str(), 100 * t.sync_s / tot);
}

/// Local (rank 0). What the run directory holds, and the command that draws its metrics (unless
/// --no-plot): plots are drawn outside the ranks, by scripts/plot-metrics.
inline void print_run_directory(const TrainOptions& o) {
  if (o.run_dir.empty()) return;
  const char* d = o.run_dir.c_str();
  std::printf("run directory: %s\n  metrics:     %s/metrics.csv\n", d, d);
  if (o.plot)
    std::printf("  plot:        scripts/plot-metrics %s/metrics.csv %s/metrics.png\n", d, d);
  std::printf(
      "  per-rank timings: %s/timing-rank-*.csv\n  checkpoints: %s/ckpt-*.h5 (a restart with the "
      "same options continues from the newest)\n",
      d, d);
}

}  // namespace dtrain_cli
