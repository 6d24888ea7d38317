// dtrain: the one way every polling wait in the communication layer gives the core away.
//
// A wait that polls (a transport's wait_until, the shm algorithm's counters, a cancel that waits
// for a copy in progress) first spins for a few microseconds, since a partner running on another
// core answers within that; then yields the core between polls, since a partner sharing this core
// (more ranks than free cores) needs it and a yield with nothing else runnable returns at once;
// and after 2 ms sleeps between polls, the sleep doubling up to 1 ms, so that a stalled wait (a
// late or stopped rank) costs about a thousandth of a core instead of a whole one for minutes.
//
// The spin phase can be lengthened by a wait that knows its partner is running on another core
// and answers within a known time (the shm algorithm: one chunk copy). On a machine where other
// processes are runnable, a yield is not free: the scheduler hands the core to one of them for
// the rest of a time slice (milliseconds), so a wait that yields every few microseconds while
// its partner copies a 256 KiB chunk loses a time slice per chunk (measured: about two
// involuntary context switches per chunk and 4x lower bandwidth for shm at 16 MiB on a loaded
// 2-core machine, benchmarks/RESULTS.md).
#pragma once

#include <chrono>
#include <thread>

#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// State of one polling wait. Local object; call pause() after each unsuccessful poll.
class Backoff {
 public:
  static constexpr double kSpinSeconds = 5e-6;
  /// Spins for `spin_seconds` (at least kSpinSeconds) before yielding.
  explicit Backoff(double spin_seconds = kSpinSeconds) noexcept
      : spin_(spin_seconds > kSpinSeconds ? spin_seconds : kSpinSeconds) {}
  static constexpr double kYieldSeconds = 2e-3;
  static constexpr double kMaxSleepSeconds = 1e-3;

  /// Gives the core away as much as the time already waited calls for.
  void pause() noexcept {
    if (++polls_ < 16) return;  // the first polls are too cheap to be worth a clock read
    const double t = now_seconds();
    if (start_ < 0) start_ = t;
    const double waited = t - start_;
    if (waited < spin_) return;
    if (waited < spin_ + kYieldSeconds) {
      std::this_thread::yield();
      return;
    }
    sleep_ = sleep_ <= 0 ? 20e-6 : (sleep_ * 2 > kMaxSleepSeconds ? kMaxSleepSeconds : sleep_ * 2);
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_));
  }
  /// True once the wait has passed the spin and yield phases (a caller that can block on a
  /// condition variable instead should do so from here on).
  bool past_yield() const noexcept {
    return start_ >= 0 && now_seconds() - start_ >= spin_ + kYieldSeconds;
  }

 private:
  double spin_;
  unsigned polls_ = 0;
  double start_ = -1;
  double sleep_ = 0;
};

/// Polls `done()` with a Backoff (spinning `spin_seconds` before yielding) until it returns true
/// (true) or `deadline` passes (false).
template <class Done>
bool poll_until(Done&& done, const Deadline& deadline,
                double spin_seconds = Backoff::kSpinSeconds) {
  Backoff b(spin_seconds);
  for (;;) {
    if (done()) return true;
    if (deadline.expired()) return done();
    b.pause();
  }
}

}  // namespace dtrain::detail
