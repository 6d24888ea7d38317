// SPDX-License-Identifier: BSD-3-Clause
// dtrain: monotonic time.
#pragma once

#include <atomic>
#include <chrono>

namespace dtrain {

/// Seconds on the monotonic clock since an arbitrary fixed point. Thread-safe.
inline double now_seconds() noexcept {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

/// Stopwatch on the monotonic clock. Local object.
class Timer {
 public:
  Timer() noexcept : start_(now_seconds()) {}
  void reset() noexcept { start_ = now_seconds(); }
  double seconds() const noexcept { return now_seconds() - start_; }
  double millis() const noexcept { return seconds() * 1e3; }
  double micros() const noexcept { return seconds() * 1e6; }

 private:
  double start_;
};

/// A point in time after which a blocking wait gives up.
///
/// A deadline made with Deadline::polled also serves the communication layer's polling waits in
/// two more ways:
/// - Descheduling. Such a wait checks the deadline at least every half second (its polls sleep
///   for at most milliseconds, its condition-variable and futex waits are cut into short slices),
///   so a gap of more than kDescheduledGapSeconds between two checks means that this thread did
///   not run: the process was stopped (SIGSTOP, a debugger), swapped, or starved by the
///   scheduler. That time is not the peer's fault, so the deadline moves back by it (by at most
///   kMaxExtensionBudgets budgets in all) and descheduled_seconds() reports it for the timeout
///   message.
/// - Abandonment. The deadline may watch an abandon flag (a communicator's, set when one of its
///   collectives failed or a handle is dropped while an error unwinds the stack); once the flag
///   is set, expired() is true and remaining() is 0, so every wait bounded by it ends at once.
/// Not thread-safe: one thread checks a deadline at a time (the gap tracking updates it).
class Deadline {
 public:
  /// Gap between two checks of a polled deadline beyond which the waiting thread counts as
  /// descheduled (the longest regular gap is a 0.5 s condition-variable slice).
  static constexpr double kDescheduledGapSeconds = 1.0;
  /// Bound of the total extension, in budgets (a process stopped again and again still gives up).
  static constexpr double kMaxExtensionBudgets = 4.0;

  /// `seconds` from now; a negative value means never. No gap tracking, no abandon flag (for
  /// waits that may block for the whole remaining time in one call).
  explicit Deadline(double seconds) noexcept
      : start_(now_seconds()), end_(seconds < 0 ? -1.0 : start_ + seconds), budget_(seconds) {}
  /// A deadline for a polling wait: `seconds` from now (negative: never), tracking descheduling
  /// gaps and ending early once `*abandon` (if not null; it must outlive the deadline) is set.
  static Deadline polled(double seconds, const std::atomic<bool>* abandon = nullptr) noexcept {
    Deadline d(seconds);
    d.abandon_ = abandon;
    d.last_ = now_seconds();
    return d;
  }

  bool expired() const noexcept {
    if (abandoned()) return true;
    if (end_ < 0) return false;
    const double t = track(now_seconds());  // may move end_ back: read it afterwards
    return t > end_;
  }
  double remaining() const noexcept {
    if (abandoned()) return 0;
    if (end_ < 0) return 1e300;
    const double t = track(now_seconds());
    return end_ - t;
  }
  /// The budget this deadline was created with, for messages ("timed out after 300 s").
  double budget() const noexcept { return budget_; }
  /// When this deadline was created (now_seconds()).
  double started() const noexcept { return start_; }
  /// True when the abandon flag this deadline watches is set.
  bool abandoned() const noexcept { return abandon_ && abandon_->load(std::memory_order_acquire); }
  /// Seconds this thread lost between two checks of a polled deadline (each gap longer than
  /// kDescheduledGapSeconds, summed); the deadline was extended by them (within its bound).
  double descheduled_seconds() const noexcept { return lost_; }
  /// The longest such gap (0 when there was none).
  double longest_gap() const noexcept { return longest_; }

 private:
  // Records the time of this check; a long gap since the previous one extends the deadline.
  double track(double t) const noexcept {
    if (last_ < 0) return t;
    const double gap = t - last_;
    last_ = t;
    if (gap > kDescheduledGapSeconds) {
      lost_ += gap;
      if (gap > longest_) longest_ = gap;
      double extend = kMaxExtensionBudgets * budget_ - extended_;
      if (extend > gap) extend = gap;
      if (extend > 0) {
        end_ += extend;
        extended_ += extend;
      }
    }
    return t;
  }

  double start_;
  mutable double end_;
  double budget_;
  const std::atomic<bool>* abandon_ = nullptr;
  mutable double last_ = -1;  // time of the previous check; < 0: no gap tracking
  mutable double lost_ = 0, longest_ = 0, extended_ = 0;
};

}  // namespace dtrain
