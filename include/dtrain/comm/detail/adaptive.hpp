// dtrain: the schedule by which an `automatic` all-reduce plan checks its algorithm while it is
// used. The calibration prices each algorithm once, at the start of the job; what it measured
// may not hold later (other jobs on the network or the node, a hypervisor that moves the cores,
// a calibration taken in a burst of noise). So a plan whose algorithm `automatic` chose keeps the
// runner-up's plan beside its own and, now and then, runs it instead in a short window of
// interleaved executions; the ranks agree on both medians (the slowest rank's) and the plan
// changes to the runner-up when it was faster by more than kAdaptSwitchFactor.
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
/// Timed pairs per window (one execution of each algorithm per pair, the order alternating
/// from pair to pair), after one untimed warm-up execution of the runner-up.
inline constexpr int kAdaptPairs = 3;
/// Executions from the end of one window to the start of the next: the shortest (after a
/// switch, and at the start) and the longest; the gap doubles after every window that kept the
/// algorithm. A runner-up 2x slower then costs at most (kAdaptPairs + 1) / kAdaptMaxGap = 0.4%
/// once the gap is long.
inline constexpr std::uint64_t kAdaptMinGap = 16;
inline constexpr std::uint64_t kAdaptMaxGap = 1024;
/// The runner-up takes over when its agreed median times this is below the agreed median of the
/// algorithm in use (the calibration's own margin, detail::kSwitchFactor, for the same reason:
/// a near tie is left alone).
inline constexpr double kAdaptSwitchFactor = 1.1;

/// Test hook: when set, every timed execution of an adaptive plan passes through it and the
/// value it returns is used instead of the measured seconds (tests make one algorithm faster on
/// purpose). Set it before the plans run and clear it after; called concurrently from every
/// rank's thread.
struct AdaptSample {
  int rank = 0;
  AllreduceAlgorithm algo = AllreduceAlgorithm::ring;
  std::size_t bytes = 0;
  std::uint64_t execution = 0;  // the plan's execution count (0 = its first)
  double seconds = 0;
};
inline std::function<double(const AdaptSample&)>& adapt_hook() {
  static std::function<double(const AdaptSample&)> hook;
  return hook;
}

/// The window schedule of one plan. Call `next_is_runner_up()` before each execution, run the
/// algorithm it names, then `record(seconds)`; when that returns true, agree on `medians()` with
/// every rank (maximum over ranks) and pass the result to `decide()` before the next execution.
class AdaptSchedule {
 public:
  /// Whether the coming execution runs the runner-up rather than the algorithm in use.
  bool next_is_runner_up() const noexcept {
    if (pos_ < 0) return false;
    if (pos_ == 0) return true;  // the runner-up's untimed warm-up
    const int pair = (pos_ - 1) / 2, second = (pos_ - 1) % 2;
    const bool runner_first = pair % 2 == 0;
    return runner_first != (second == 1);
  }
  /// Whether the coming execution is timed for the window.
  bool timing() const noexcept { return pos_ > 0; }

  /// Records the execution just run (its seconds count only inside a window). True when it
  /// closed a window: the vote is due.
  bool record(double seconds) noexcept {
    const bool runner = next_is_runner_up();
    ++executions_;
    if (pos_ < 0) {
      if (executions_ >= next_window_) pos_ = 0;
      return false;
    }
    if (pos_ > 0) {
      const int pair = (pos_ - 1) / 2;
      (runner ? runner_ : lead_)[static_cast<std::size_t>(pair)] = seconds;
    }
    if (++pos_ <= 2 * kAdaptPairs) return false;
    pos_ = -1;
    return true;
  }

  /// This rank's medians of the closed window: {algorithm in use, runner-up}.
  std::array<double, 2> medians() const noexcept { return {median(lead_), median(runner_)}; }

  /// Applies the agreed medians of the closed window (the same on every rank): the runner-up
  /// takes over when faster by the margin. Schedules the next window. True when it switched.
  bool decide(double lead_seconds, double runner_seconds) noexcept {
    const bool change = runner_seconds * kAdaptSwitchFactor < lead_seconds;
    if (change) {
      runner_leads_ = !runner_leads_;
      ++switches_;
      gap_ = kAdaptMinGap;
    } else {
      gap_ = std::min(gap_ * 2, kAdaptMaxGap);
    }
    ++windows_;
    next_window_ = executions_ + gap_;
    last_ = {lead_seconds, runner_seconds};
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
  static double median(std::array<double, kAdaptPairs> v) noexcept {
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  }

  std::uint64_t executions_ = 0;
  std::uint64_t next_window_ = kAdaptFirstWindow;
  std::uint64_t gap_ = kAdaptMinGap / 2;  // doubled to kAdaptMinGap by the first window kept
  int pos_ = -1;                          // -1 between windows, else the step within the window
  std::array<double, kAdaptPairs> lead_{}, runner_{};
  std::array<double, 2> last_{};
  bool runner_leads_ = false;
  int windows_ = 0, switches_ = 0;
};

}  // namespace dtrain::detail
