// Test support: an in-process watchdog so that a hung test ends with a message instead of
// waiting for the CTest timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace dtrain::test {

/// Starts a thread that calls `on_expiry` after DTRAIN_TEST_WATCHDOG_S seconds (default 300)
/// unless stopped first. Destroying the watchdog stops it.
class Watchdog {
 public:
  explicit Watchdog(std::function<void(double)> on_expiry) {
    double seconds = 300;
    if (const char* s = std::getenv("DTRAIN_TEST_WATCHDOG_S")) seconds = std::atof(s);
    if (seconds <= 0) return;
    thread_ = std::thread([this, seconds, on_expiry] {
      std::unique_lock<std::mutex> lock(m_);
      if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stop_; }))
        on_expiry(seconds);
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dtrain::test
