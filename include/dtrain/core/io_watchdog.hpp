// SPDX-License-Identifier: BSD-3-Clause
// dtrain: deadlines for collective file calls that cannot be cancelled.
//
// A collective MPI-IO call (a parallel checkpoint write, a collective HDF5 open, read or close)
// returns on a rank only once every rank of the communicator has joined it. If one rank fails
// before or inside it (a read error, an exception, a stopped process), the others wait in MPI-IO
// for a partner that will never come; MPI offers no way to cancel that wait, and without a
// deadline the job would spend the rest of its allocation there. A watchdog gives the call a
// deadline: a thread sleeps until the call finishes or the deadline passes, and at the deadline it
// ends the job through abort_job (<dtrain/core/failure.hpp>: MPI_Abort through the transport's
// abort hook), after printing what this rank waited for.
//
// IoWatchdog watches one section and starts a thread for it (a checkpoint write, a file open).
// IoWatchdogThread is for collective calls made often (a collective read per batch): its thread
// starts at the first arm() and lives as long as it, arm() and disarm() take a lock and nothing
// else, and the thread looks at the armed section every tenth of the deadline (at most every
// second), so a deadline is noticed up to that much late.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <dtrain/core/expiry_timer.hpp>
#include <dtrain/core/failure.hpp>

namespace dtrain::detail {

/// Test knob: when set, an expired watchdog calls this with its message instead of ending the
/// job (tests check the message while the call goes on). Set it before the watchdogs start,
/// clear it after they finished.
inline std::function<void(const std::string&)>& io_watchdog_expiry_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

/// What an expired watchdog does: the test hook when one is set, else end the job.
inline void io_watchdog_expired(const std::string& message) {
  if (const auto& hook = io_watchdog_expiry_hook()) return hook(message);
  abort_job(message, 1);
}

/// Ends the job with `message` (abort_job) unless destroyed within `seconds` of its
/// construction. Local; construct it right before the collective section, destroy it right
/// after (also on the exception path: the destructor only calls the deadline off). A deadline
/// <= 0 disables it.
class IoWatchdog {
 public:
  IoWatchdog(double seconds, std::string message)
      : timer_(seconds, [message = std::move(message)] { io_watchdog_expired(message); }) {}

 private:
  ExpiryTimer timer_;
};

/// A re-armable IoWatchdog for sections entered often: between arm(message) and disarm() the
/// section has `seconds`; when they pass, the job is ended with `message` (once per arm()).
/// A deadline <= 0 disables it (no thread). arm() and disarm() are local and cheap (a lock; the
/// thread starts at the first arm()); one section at a time. Not movable; the destructor stops
/// the thread.
class IoWatchdogThread {
 public:
  explicit IoWatchdogThread(double seconds) : seconds_(seconds) {}
  IoWatchdogThread(const IoWatchdogThread&) = delete;
  IoWatchdogThread& operator=(const IoWatchdogThread&) = delete;
  ~IoWatchdogThread() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  double seconds() const noexcept { return seconds_; }

  void arm(std::string message) {
    if (!(seconds_ > 0)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    message_ = std::move(message);
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(seconds_));
    armed_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
  }

  void disarm() noexcept {
    if (!(seconds_ > 0)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void watch() {
    const auto period = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::min(seconds_ / 10, 1.0)));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (cv_.wait_for(lock, period, [this] { return stop_; })) return;
      if (!armed_ || Clock::now() < deadline_) continue;
      armed_ = false;  // once per arm()
      const std::string message = message_;
      lock.unlock();
      io_watchdog_expired(message);
      lock.lock();
    }
  }

  double seconds_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool armed_ = false;
  Clock::time_point deadline_{};
  std::string message_;
  std::thread thread_;
};

}  // namespace dtrain::detail
