// SPDX-License-Identifier: BSD-3-Clause
// dtrain: PendingLoss, the loss of a queued training pass, brought to the host only when read.
#pragma once

#include <cstdint>
#include <string>

#include <dtrain/core/error.hpp>
#include <dtrain/exec/exec_traits.hpp>

namespace dtrain {

/// The mean loss of one forward_backward. The pass queues an asynchronous copy of the loss into
/// one of the model's host slots; reading the value (get(), or the implicit conversion to
/// double) waits for that copy only, so a training loop that does not read the loss never waits
/// for the device. Slots are reused after `BasicSequential::loss_slots` later passes; reading an
/// overwritten loss throws InvalidArgument. Local; valid while its model lives. Copyable.
template <class Exec>
class PendingLoss {
 public:
  PendingLoss() = default;
  PendingLoss(Exec* exec, typename Exec::event_type event, const double* value,
              const std::uint64_t* slot_pass, std::uint64_t pass) noexcept
      : exec_(exec), event_(event), value_(value), slot_pass_(slot_pass), pass_(pass) {}

  /// Non-blocking: whether the value has reached the host.
  bool ready() const {
    check("PendingLoss::ready");
    return !exec_ || exec_->query(event_);
  }
  /// Blocking (bounded by exec_timeout_s(), TimeoutError): the loss on the host.
  double get() const {
    check("PendingLoss::get");
    if (!exec_) return 0.0;
    exec_wait(*exec_, event_, exec_timeout_s(), "PendingLoss::get");
    return *value_;
  }
  operator double() const { return get(); }  // NOLINT: reads like the double it stands for

 private:
  void check(const char* op) const {
    DTRAIN_REQUIRE(!slot_pass_ || *slot_pass_ == pass_, op,
                   "the loss of pass " << pass_ << " was overwritten by pass " << *slot_pass_
                                       << "; read a loss before the model's slots wrap around");
  }

  Exec* exec_ = nullptr;
  typename Exec::event_type event_{};
  const double* value_ = nullptr;
  const std::uint64_t* slot_pass_ = nullptr;
  std::uint64_t pass_ = 0;
};

}  // namespace dtrain
