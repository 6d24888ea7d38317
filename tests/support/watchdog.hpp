// Test support: an in-process watchdog so that a hung test ends with a message instead of
// waiting for the CTest timeout, and a recorder of the library's expired I/O and setup deadlines.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/expiry_timer.hpp>
#include <dtrain/core/io_watchdog.hpp>

namespace dtrain::test {

/// Starts a thread that calls `on_expiry` after DTRAIN_TEST_WATCHDOG_S seconds (default 300)
/// unless stopped first. Destroying the watchdog stops it.
class Watchdog {
 public:
  explicit Watchdog(std::function<void(double)> on_expiry)
      : timer_(seconds(), [on_expiry = std::move(on_expiry)] { on_expiry(seconds()); }) {}

 private:
  static double seconds() {
    const char* s = std::getenv("DTRAIN_TEST_WATCHDOG_S");
    return s ? std::atof(s) : 300;
  }
  detail::ExpiryTimer timer_;
};

/// While it lives (or until stop()), an expired IoWatchdog (collective MPI-IO, a transport's
/// setup) records its message here instead of ending the job. One per process at a time.
class ExpiryRecorder {
 public:
  ExpiryRecorder() {
    detail::io_watchdog_expiry_hook() = [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(m_);
      messages_.push_back(message);
    };
  }
  ~ExpiryRecorder() { stop(); }
  ExpiryRecorder(const ExpiryRecorder&) = delete;
  ExpiryRecorder& operator=(const ExpiryRecorder&) = delete;

  /// Expiries from now on end the job again.
  void stop() { detail::io_watchdog_expiry_hook() = nullptr; }
  /// The messages recorded so far, in order.
  std::vector<std::string> messages() const {
    std::lock_guard<std::mutex> lock(m_);
    return messages_;
  }

 private:
  mutable std::mutex m_;
  std::vector<std::string> messages_;
};

}  // namespace dtrain::test
