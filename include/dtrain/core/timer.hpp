// dtrain: monotonic time.
#pragma once

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
class Deadline {
 public:
  /// `seconds` from now; a negative value means never.
  explicit Deadline(double seconds) noexcept
      : end_(seconds < 0 ? -1.0 : now_seconds() + seconds), budget_(seconds) {}
  bool expired() const noexcept { return end_ >= 0 && now_seconds() > end_; }
  double remaining() const noexcept { return end_ < 0 ? 1e300 : end_ - now_seconds(); }
  /// The budget this deadline was created with, for messages ("timed out after 300 s").
  double budget() const noexcept { return budget_; }

 private:
  double end_;
  double budget_;
};

}  // namespace dtrain
