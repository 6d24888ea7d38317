// SPDX-License-Identifier: BSD-3-Clause
// dtrain: TrainingLog, what a data-parallel training loop reports while it runs: rank 0's progress
// line and metrics.csv, every rank's timing file, the slowest rank named.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <dtrain/train/csv_log.hpp>
#include <dtrain/train/progress_line.hpp>
#include <dtrain/train/step_meter.hpp>
#include <dtrain/train/straggler_monitor.hpp>

namespace dtrain {

/// The record of a training run, kept in its run directory when it has one:
///   rank 0      the progress line (epoch, step, loss, samples/s, ETA; redrawn in place on a
///               terminal, plain lines in a log) and RUN/metrics.csv, one row per interval and one
///               per evaluation (metric_columns(); a value not measured in a row is left empty);
///   every rank  RUN/timing-rank-NNNNN.csv, its own compute, data-wait and sync-wait seconds per
///               interval (StragglerMonitor); the progress line names the slowest rank when it
///               lags the median by more than 10%.
/// Opening drops the rows after the step a restarted run continues from (CsvLog), so files
/// appended across restarts hold each step once. interval() is collective; the other members
/// are local and act on rank 0 only. Not thread-safe: use it from the loop's thread. Owns its
/// files; borrows `comm`, which must outlive it.
template <class Comm>
class TrainingLog {
 public:
  /// The columns of metrics.csv, step first.
  static std::vector<std::string> metric_columns() {
    return {"step",          "epoch",  "loss",      "lr",     "train_accuracy", "test_accuracy",
            "samples_per_s", "data_s", "compute_s", "sync_s", "optimizer_s"};
  }

  /// Local (opens files, no communication). `run_dir` empty: no files, the progress line only.
  /// `resumed_step`: the step a restarted run continues from, -1 for a fresh run. `epochs` and
  /// `total_steps` frame the progress line and its ETA (0: unknown). Throws IoError naming a file
  /// that cannot be written.
  TrainingLog(Comm& comm, const std::string& run_dir, std::int64_t resumed_step,
              std::int64_t epochs, std::int64_t total_steps, std::FILE* out = stdout)
      : comm_(comm),
        root_(comm.rank() == 0),
        epochs_(epochs),
        total_steps_(total_steps),
        stragglers_(comm, run_dir.empty() ? std::string() : run_dir + timing_name(comm.rank()),
                    resumed_step),
        progress_(out) {
    if (root_ && !run_dir.empty())
      metrics_ = CsvLog(run_dir + "/metrics.csv", metric_columns(), resumed_step);
  }

  /// Collective: every rank calls it at the same step. Ends `meter`'s interval, appends this rank's
  /// timing row and shares the ranks' timings (one allgather of 3 doubles per rank); rank 0 then
  /// redraws the progress line and appends a metrics row with the learning rate `lr`. Returns this
  /// rank's interval. Blocking.
  IntervalStats interval(std::int64_t step, std::int64_t epoch, StepMeter& meter, double lr) {
    const IntervalStats s = meter.take_interval();
    const StragglerReport report = stragglers_.exchange(step, s.steps, s.times.phases());
    last_loss_ = s.mean_loss;
    if (!root_) return s;
    const double sps = s.samples_per_s(comm_.size());
    ProgressState ps;
    ps.epoch = epoch;
    ps.epochs = epochs_;
    ps.step = step;
    ps.total_steps = total_steps_;
    ps.loss = s.mean_loss;
    ps.samples_per_s = sps;
    ps.note = report.describe();
    progress_.update(ps);
    if (metrics_.is_open())
      metrics_.row({static_cast<double>(step), static_cast<double>(epoch), s.mean_loss, lr, NAN,
                    NAN, sps, s.times.data_s, s.times.compute_s, s.times.sync_s,
                    s.times.optimizer_s});
    return s;
  }

  /// Local, rank 0: an evaluation's row in metrics.csv (accuracies; NaN leaves one empty).
  void evaluation(std::int64_t step, std::int64_t epoch, double lr, double train_accuracy,
                  double test_accuracy) {
    if (root_ && metrics_.is_open())
      metrics_.row({static_cast<double>(step), static_cast<double>(epoch), NAN, lr, train_accuracy,
                    test_accuracy, NAN, NAN, NAN, NAN, NAN});
  }

  /// Local, rank 0: a permanent line under the progress line.
  void message(const std::string& line) {
    if (root_) progress_.message(line);
  }
  /// Local, rank 0: ends an in-place progress line, so that later output starts on a new line.
  void end_line() {
    if (root_) progress_.end_line();
  }

  /// Mean loss of the last interval on this rank (NaN before the first).
  double last_loss() const noexcept { return last_loss_; }
  /// The path of metrics.csv on rank 0 (empty elsewhere and without a run directory).
  const std::string& metrics_path() const noexcept { return metrics_.path(); }

 private:
  static std::string timing_name(int rank) {
    char b[64];
    std::snprintf(b, sizeof b, "/timing-rank-%05d.csv", rank);
    return b;
  }

  Comm& comm_;
  bool root_;
  std::int64_t epochs_, total_steps_;
  StragglerMonitor<Comm> stragglers_;
  ProgressLine progress_;
  CsvLog metrics_;
  double last_loss_ = NAN;
};

}  // namespace dtrain
