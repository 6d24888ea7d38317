// SPDX-License-Identifier: BSD-3-Clause
// dtrain: a thread that runs an action at a deadline unless it is called off first.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace dtrain::detail {

/// Runs `on_expiry` on a thread of its own once `seconds` have passed since construction, unless
/// the timer is destroyed first; destruction calls it off and joins the thread (after the action,
/// if that has begun). A deadline <= 0 starts no thread. Local; not movable.
///
/// The constructor returns only once the thread waits: a thread still starting may hold a lock of
/// the C library or of a sanitizer's runtime, and a process forked meanwhile (a test's child, a
/// launcher's helper) inherits it locked with no owner. Without this, a child forked right after a
/// test's watchdog was created hung on its first allocation in 6 of 300 runs under load.
class ExpiryTimer {
 public:
  ExpiryTimer(double seconds, std::function<void()> on_expiry) {
    if (!(seconds > 0)) return;
    std::unique_lock<std::mutex> started(mutex_);
    thread_ = std::thread([this, seconds, on_expiry = std::move(on_expiry)] {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        started_ = true;
        cv_.notify_all();
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(seconds));
        if (cv_.wait_until(lock, until, [this] { return off_; })) return;
      }
      on_expiry();
    });
    // Woken with the lock back, i.e. once the thread released it inside its wait.
    cv_.wait(started, [this] { return started_; });
  }
  ExpiryTimer(const ExpiryTimer&) = delete;
  ExpiryTimer& operator=(const ExpiryTimer&) = delete;
  ~ExpiryTimer() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      off_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool off_ = false;
  bool started_ = false;
  std::thread thread_;
};

}  // namespace dtrain::detail
