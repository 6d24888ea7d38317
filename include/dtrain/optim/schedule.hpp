// SPDX-License-Identifier: BSD-3-Clause
// dtrain: learning-rate schedules, lr as a pure function of the optimizer step.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// A learning-rate schedule: lr(step) for step = 0, 1, 2, ... (the number of optimizer steps
/// already taken). A pure value type: copyable, thread-safe to query, and its whole position is
/// the step the optimizer checkpoints.
class Schedule {
 public:
  enum class Kind : unsigned char { constant, step, warmup_cosine };

  /// A constant rate (also the implicit conversion from a number).
  Schedule(double lr = 1e-3) : Schedule(Kind::constant, lr, 0, 1.0, 0, 0.0) {}  // NOLINT

  /// Constant `lr`.
  static Schedule constant(double lr) { return Schedule(lr); }

  /// lr * gamma^floor(step / step_size) ("step decay").
  static Schedule step_decay(double lr, std::int64_t step_size, double gamma) {
    DTRAIN_REQUIRE(step_size > 0, "Schedule::step_decay",
                   "step_size must be positive, got " << step_size);
    return Schedule(Kind::step, lr, step_size, gamma, 0, 0.0);
  }

  /// Linear warm-up from lr/warmup_steps to `peak` over `warmup_steps` steps, then cosine decay
  /// from `peak` to `min_lr` at `total_steps`, `min_lr` afterwards.
  static Schedule warmup_cosine(double peak, std::int64_t warmup_steps, std::int64_t total_steps,
                                double min_lr = 0.0) {
    DTRAIN_REQUIRE(
        warmup_steps >= 0 && total_steps > warmup_steps, "Schedule::warmup_cosine",
        "need 0 <= warmup_steps < total_steps, got " << warmup_steps << " and " << total_steps);
    return Schedule(Kind::warmup_cosine, peak, warmup_steps, 0.0, total_steps, min_lr);
  }

  /// Learning rate for the optimizer step that follows `step` completed steps.
  double lr(std::int64_t step) const noexcept {
    switch (kind_) {
      case Kind::constant: return base_;
      case Kind::step: return base_ * std::pow(gamma_, static_cast<double>(step / period_));
      case Kind::warmup_cosine: {
        if (step < period_)
          return base_ * static_cast<double>(step + 1) / static_cast<double>(period_);
        if (step >= total_) return min_;
        const double progress =
            static_cast<double>(step - period_) / static_cast<double>(total_ - period_);
        return min_ + 0.5 * (base_ - min_) * (1.0 + std::cos(3.14159265358979323846 * progress));
      }
    }
    return base_;
  }

  Kind kind() const noexcept { return kind_; }

  /// Text that identifies the schedule and its parameters (stored in checkpoints).
  std::string describe() const {
    std::ostringstream os;
    os.precision(17);
    switch (kind_) {
      case Kind::constant: os << "constant(lr=" << base_ << ")"; break;
      case Kind::step:
        os << "step(lr=" << base_ << ",step_size=" << period_ << ",gamma=" << gamma_ << ")";
        break;
      case Kind::warmup_cosine:
        os << "warmup_cosine(peak=" << base_ << ",warmup=" << period_ << ",total=" << total_
           << ",min=" << min_ << ")";
        break;
    }
    return os.str();
  }

 private:
  Schedule(Kind k, double base, std::int64_t period, double gamma, std::int64_t total, double mn)
      : kind_(k), base_(base), period_(period), gamma_(gamma), total_(total), min_(mn) {}
  Kind kind_;
  double base_;
  std::int64_t period_;  // step: step_size; warmup_cosine: warm-up steps
  double gamma_;
  std::int64_t total_;
  double min_;
};

}  // namespace dtrain
