// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the schedule by which an `automatic` all-reduce plan checks its algorithm while it is
// used. The calibration prices each algorithm once, at the start of the job; what it measured
// may not hold later (other jobs on the network or the node, a hypervisor that moves the cores,
// a calibration taken in a burst of noise). So a plan whose algorithm `automatic` chose keeps the
// runner-up's plan beside its own and, now and then, runs it instead in a short window: a block
// of the runner-up's executions, then a block of its own; the ranks agree on every timing (the
// slowest rank's) and the plan changes to the runner-up when two windows in a row found it
// faster by more than kAdaptSwitchFactor.
//
// Everything here is a function of the plan's execution count and of the agreed medians, so
// every rank runs the same algorithm at every execution without any extra message but the vote
// at the end of a window. Pure bookkeeping: no allocation, no clock, no transport.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>

#include <dtrain/comm/allreduce_algorithm.hpp>

namespace dtrain::detail {

/// Executions of a plan before its first window (the algorithm in use warms up first).
inline constexpr std::uint64_t kAdaptFirstWindow = 4;
/// A window runs the runner-up kAdaptBlock + 1 times in a row and the algorithm in use as often
/// (the runner-up first in even windows, second in odd ones), and times all but the first of
/// each block: each is timed in its own steady state (caches, waits that learnt their
/// partner's pace), not right after the other one.
inline constexpr int kAdaptBlock = 4;
inline constexpr int kAdaptWindow = 2 * (kAdaptBlock + 1);
/// Executions from the end of one window to the start of the next: the shortest (after a
/// change, and at the start) and the longest; the gap doubles after every window that kept the
/// algorithm. A runner-up 2x slower then costs at most (kAdaptBlock + 1) / kAdaptMaxGap = 0.5%
/// of the calls' time once the gap is long.
inline constexpr std::uint64_t kAdaptMinGap = 16;
inline constexpr std::uint64_t kAdaptMaxGap = 1024;
/// The runner-up is favoured by a window when both its agreed median and its fastest agreed
/// time, times this, are below those of the algorithm in use (the calibration's margin,
/// detail::kSwitchFactor, for the same reason: a near tie is left alone; the fastest time too,
/// so that a block whose ranks were mostly descheduled does not decide). It takes over when two
/// windows in a row favour it, the second kAdaptConfirmGap executions after the first, with the
/// blocks in the other order.
inline constexpr double kAdaptSwitchFactor = 1.1;
inline constexpr std::uint64_t kAdaptConfirmGap = 8;

/// One timed execution of an adaptive plan, as the test hook sees it.
struct AdaptSample {
  int rank = 0;
  AllreduceAlgorithm algo = AllreduceAlgorithm::ring;
  std::size_t bytes = 0;
  std::uint64_t execution = 0;  // the plan's execution count (0 = its first)
  double seconds = 0;
};
/// Test hook: when set, every timed execution of an adaptive plan passes through it and the
/// value it returns is used instead of the measured seconds (tests make one algorithm faster on
/// purpose). Set it before the plans run and clear it after; called concurrently from every
/// rank's thread.
inline std::function<double(const AdaptSample&)>& adapt_hook() {
  static std::function<double(const AdaptSample&)> hook;
  return hook;
}

/// The window schedule of one plan. Call `next_is_runner_up()` before each execution, run the
/// algorithm it names, then `record(seconds)`; when that returns true, replace every element of
/// `samples()` by its maximum over the ranks (the slowest rank's time of each timed execution)
/// and call `decide()` before the next execution.
class AdaptSchedule {
 public:
  using Samples = std::array<double, 2 * kAdaptBlock>;  // runner-up's, then the one in use's

  /// Whether the coming execution runs the runner-up rather than the algorithm in use.
  bool next_is_runner_up() const noexcept {
    return pos_ >= 0 && (pos_ <= kAdaptBlock) == runner_first();
  }
  /// Whether the coming execution is timed for the window (not the first of its block).
  bool timing() const noexcept { return pos_ > 0 && pos_ != kAdaptBlock + 1; }

  /// Records the execution just run (its seconds count only when timed). True when it closed a
  /// window: the vote is due.
  bool record(double seconds) noexcept {
    ++executions_;
    if (pos_ < 0) {
      if (executions_ >= next_window_) pos_ = 0;
      return false;
    }
    if (timing()) {
      const bool first_block = pos_ <= kAdaptBlock;
      const int in_block = first_block ? pos_ - 1 : pos_ - kAdaptBlock - 2;
      const int base = first_block == runner_first() ? 0 : kAdaptBlock;
      samples_[static_cast<std::size_t>(base + in_block)] = seconds;
    }
    if (++pos_ < kAdaptWindow) return false;
    pos_ = -1;
    return true;
  }

  /// This rank's times of the closed window, to be replaced by the agreed ones.
  Samples& samples() noexcept { return samples_; }

  /// Applies the agreed times of the closed window (the same on every rank) and schedules the
  /// next window. True when the runner-up took over.
  bool decide() noexcept {
    const double runner = median(0), lead = median(kAdaptBlock);
    last_ = {lead, runner};
    ++windows_;
    const bool favoured = runner * kAdaptSwitchFactor < lead &&
                          fastest(0) * kAdaptSwitchFactor < fastest(kAdaptBlock);
    bool change = false;
    if (favoured && pending_) {
      change = true;
      pending_ = false;
      runner_leads_ = !runner_leads_;
      ++switches_;
      gap_ = kAdaptMinGap;
    } else if (favoured) {
      pending_ = true;  // confirmed or not by the next window, soon
      next_window_ = executions_ + kAdaptConfirmGap;
      return false;
    } else {
      pending_ = false;
      gap_ = std::min(gap_ * 2, kAdaptMaxGap);
    }
    next_window_ = executions_ + gap_;
    return change;
  }

  /// Whether the plan's second algorithm (the runner-up at construction) is the one in use.
  bool swapped() const noexcept { return runner_leads_; }
  std::uint64_t executions() const noexcept { return executions_; }
  int windows() const noexcept { return windows_; }
  int switches() const noexcept { return switches_; }
  /// The agreed medians of the last window ({in use then, runner-up then}; zeros before one).
  std::array<double, 2> last_vote() const noexcept { return last_; }

 private:
  bool runner_first() const noexcept { return windows_ % 2 == 0; }
  double fastest(int from) const noexcept {
    const double* b = samples_.data() + from;
    return *std::min_element(b, b + kAdaptBlock);
  }
  double median(int from) const noexcept {
    std::array<double, kAdaptBlock> v{};
    for (int i = 0; i < kAdaptBlock; ++i)
      v[static_cast<std::size_t>(i)] = samples_[static_cast<std::size_t>(from + i)];
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  }

  std::uint64_t executions_ = 0;
  std::uint64_t next_window_ = kAdaptFirstWindow;
  std::uint64_t gap_ = kAdaptMinGap / 2;  // doubled to kAdaptMinGap by the first window kept
  int pos_ = -1;                          // -1 between windows, else the step within the window
  Samples samples_{};
  std::array<double, 2> last_{};
  bool runner_leads_ = false, pending_ = false;
  int windows_ = 0, switches_ = 0;
};

}  // namespace dtrain::detail
