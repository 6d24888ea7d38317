// dtrain: a deadline for a collective file write that cannot be cancelled.
//
// A parallel (MPI-IO) checkpoint write is a chain of collective HDF5 calls. If one rank fails
// inside it (a write error, an exception, a stopped process), the others wait in MPI-IO for a
// partner that will never come; MPI offers no way to cancel that wait, and without a deadline the
// job would spend the rest of its allocation there. IoWatchdog gives the write a deadline: a
// thread sleeps until the write finishes or the deadline passes, and at the deadline it ends the
// job through abort_job (<dtrain/core/failure.hpp>: MPI_Abort through the transport's abort hook),
// after printing what this rank waited for. The checkpoint being written is a temporary file, so
// the published checkpoints are intact and the job restarts from the newest one.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include <dtrain/core/expiry_timer.hpp>
#include <dtrain/core/failure.hpp>

namespace dtrain::detail {

/// Test knob: when set, an expired IoWatchdog calls this with its message instead of ending the
/// job (tests check the message while the write goes on). Set it before the watchdogs start,
/// clear it after they finished.
inline std::function<void(const std::string&)>& io_watchdog_expiry_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

/// Ends the job with `message` (abort_job) unless destroyed within `seconds` of its
/// construction. Local; construct it right before the collective section, destroy it right
/// after (also on the exception path: the destructor only calls the deadline off). A deadline
/// <= 0 disables it.
class IoWatchdog {
 public:
  IoWatchdog(double seconds, std::string message)
      : timer_(seconds, [message = std::move(message)] {
          if (const auto& hook = io_watchdog_expiry_hook()) return hook(message);
          abort_job(message, 1);
        }) {}

 private:
  ExpiryTimer timer_;
};

}  // namespace dtrain::detail
