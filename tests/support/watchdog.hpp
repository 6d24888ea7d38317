// Test support: an in-process watchdog so that a hung test ends with a message instead of
// waiting for the CTest timeout.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include <dtrain/core/expiry_timer.hpp>

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

}  // namespace dtrain::test
