// SPDX-License-Identifier: BSD-3-Clause
// dtrain: StepMeter, one rank's seconds per phase of its training steps, per interval and in total.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <dtrain/core/timer.hpp>
#include <dtrain/train/straggler_monitor.hpp>

namespace dtrain {

/// Seconds one rank spent in each phase of its training steps.
struct StepTimes {
  double data_s = 0;       ///< waiting for the next batch
  double compute_s = 0;    ///< forward and backward
  double sync_s = 0;       ///< waiting for the gradient average (and updates made inside the wait)
  double optimizer_s = 0;  ///< the optimizer step after the wait

  double total() const noexcept { return data_s + compute_s + sync_s + optimizer_s; }
  StepTimes& operator+=(const StepTimes& o) noexcept {
    data_s += o.data_s;
    compute_s += o.compute_s;
    sync_s += o.sync_s;
    optimizer_s += o.optimizer_s;
    return *this;
  }
  /// The same seconds as StragglerMonitor counts them: the optimizer is part of the compute.
  PhaseTimes phases() const noexcept { return PhaseTimes{compute_s + optimizer_s, data_s, sync_s}; }
};

/// What a StepMeter measured over one interval of steps (on this rank).
struct IntervalStats {
  StepTimes times;
  std::int64_t steps = 0;
  std::int64_t samples = 0;  ///< samples this rank trained on
  double mean_loss = NAN;    ///< mean of the steps' losses (NaN without a step)
  double wall_s = 0;         ///< wall time from the interval's start to its end

  /// Samples per second of `world` ranks that each trained on as many samples (NaN if no time).
  double samples_per_s(int world) const noexcept {
    return wall_s > 0 ? static_cast<double>(samples) * world / wall_s : NAN;
  }
};

/// The clock of one rank's training loop. Per step: start_step() before fetching the batch, then
/// data_done(), compute_done(), sync_done() and optimizer_done() as each phase ends (each adds the
/// seconds since the previous mark to its phase; skip the ones a loop does not have), then
/// step_done(). take_interval() at each report hands over the interval's sums and starts the next
/// one; the run's totals and the current epoch's mean loss are kept alongside. Local, no
/// allocation; not thread-safe (one meter per rank's loop).
class StepMeter {
 public:
  /// Starts the clocks: the first interval begins now.
  StepMeter() = default;

  /// Restarts the phase clock: the next mark measures from here.
  void start_step() noexcept { phase_.reset(); }
  void data_done() noexcept { current_.times.data_s += lap(); }
  void compute_done() noexcept { current_.times.compute_s += lap(); }
  void sync_done() noexcept { current_.times.sync_s += lap(); }
  void optimizer_done() noexcept { current_.times.optimizer_s += lap(); }

  /// Counts one finished step of `samples` samples whose loss was `loss`.
  void step_done(std::size_t samples, double loss) noexcept {
    ++current_.steps;
    current_.samples += static_cast<std::int64_t>(samples);
    loss_sum_ += loss;
    epoch_loss_sum_ += loss;
    ++epoch_steps_;
  }

  /// Ends the current interval: returns its sums (wall time included) and starts the next one.
  IntervalStats take_interval() noexcept {
    IntervalStats s = current_;
    s.wall_s = interval_.seconds();
    s.mean_loss = s.steps > 0 ? loss_sum_ / static_cast<double>(s.steps) : NAN;
    done_times_ += s.times;
    done_samples_ += s.samples;
    current_ = IntervalStats{};
    loss_sum_ = 0;
    interval_.reset();
    return s;
  }

  /// Seconds per phase over the whole run so far (the current interval included).
  StepTimes total_times() const noexcept {
    StepTimes t = done_times_;
    t += current_.times;
    return t;
  }
  /// Samples this rank trained on over the whole run so far.
  std::int64_t total_samples() const noexcept { return done_samples_ + current_.samples; }

  /// Mean loss of the steps since the last start_epoch() (NaN without a step).
  double epoch_mean_loss() const noexcept {
    return epoch_steps_ > 0 ? epoch_loss_sum_ / static_cast<double>(epoch_steps_) : NAN;
  }
  /// Starts the next epoch's mean loss.
  void start_epoch() noexcept {
    epoch_loss_sum_ = 0;
    epoch_steps_ = 0;
  }

 private:
  double lap() noexcept {
    const double s = phase_.seconds();
    phase_.reset();
    return s;
  }

  Timer phase_;
  Timer interval_;
  IntervalStats current_;
  double loss_sum_ = 0;
  StepTimes done_times_;
  std::int64_t done_samples_ = 0;
  double epoch_loss_sum_ = 0;
  std::int64_t epoch_steps_ = 0;
};

}  // namespace dtrain
