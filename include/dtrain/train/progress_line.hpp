// SPDX-License-Identifier: BSD-3-Clause
// dtrain: ProgressLine, rank 0's view of a training run (step, loss, throughput, ETA).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace dtrain {

/// One progress report (all fields as the caller measured them).
struct ProgressState {
  std::int64_t epoch = 0;        ///< 0-based
  std::int64_t epochs = 0;       ///< total epochs (0: unknown)
  std::int64_t step = 0;         ///< optimizer steps done
  std::int64_t total_steps = 0;  ///< steps the run will take (0: unknown, no ETA)
  double loss = NAN;             ///< mean training loss over the interval
  double samples_per_s = NAN;    ///< all ranks together, over the interval
  std::string note;              ///< appended as is (e.g. a straggler warning)
};

/// Progress output: on a terminal the line is redrawn in place ('\r', cleared to the end), in a
/// log file (or pipe) every update is a plain line. The ETA comes from an exponential moving
/// average of seconds per step, so a slow start (warm-up, first checkpoint) fades out. Local;
/// not thread-safe; call it on one rank.
class ProgressLine {
 public:
  explicit ProgressLine(std::FILE* out = stdout)
      : ProgressLine(out, ::isatty(::fileno(out)) == 1) {}
  ProgressLine(std::FILE* out, bool in_place) : out_(out), in_place_(in_place) {}

  bool in_place() const noexcept { return in_place_; }

  /// Prints (or redraws) the line for `s`.
  void update(const ProgressState& s) {
    const double now = seconds();
    if (last_step_ >= 0 && s.step > last_step_) {
      const double per = (now - last_time_) / static_cast<double>(s.step - last_step_);
      sec_per_step_ = sec_per_step_ > 0 ? 0.7 * sec_per_step_ + 0.3 * per : per;
    }
    last_step_ = s.step;
    last_time_ = now;
    const std::string text = format(s, eta_seconds(s));
    if (in_place_) {
      std::fprintf(out_, "\r%s\033[K", text.c_str());
      drawn_ = true;
    } else {
      std::fprintf(out_, "%s\n", text.c_str());
    }
    std::fflush(out_);
  }

  /// Prints a permanent line (ends an in-place line first).
  void message(const std::string& line) {
    end_line();
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }

  /// Ends an in-place line so that later output starts on a fresh line.
  void end_line() {
    if (drawn_) std::fputc('\n', out_);
    drawn_ = false;
  }

  /// Estimated seconds left (NaN while unknown).
  double eta_seconds(const ProgressState& s) const {
    if (s.total_steps <= 0 || sec_per_step_ <= 0) return NAN;
    return sec_per_step_ * static_cast<double>(std::max<std::int64_t>(0, s.total_steps - s.step));
  }

  /// "1h02m", "3m05s", "12s"; "?" for NaN.
  static std::string duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const long long t = static_cast<long long>(std::llround(s));
    char b[32];
    if (t >= 3600)
      std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
    else if (t >= 60)
      std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
    else
      std::snprintf(b, sizeof b, "%llds", t);
    return b;
  }

  /// The text of one line.
  static std::string format(const ProgressState& s, double eta) {
    char b[256];
    const int width =
        s.total_steps > 0 ? static_cast<int>(std::to_string(s.total_steps).size()) : 1;
    std::string text;
    if (s.epochs > 0)
      std::snprintf(b, sizeof b, "epoch %lld/%lld  ", static_cast<long long>(s.epoch + 1),
                    static_cast<long long>(s.epochs));
    else
      std::snprintf(b, sizeof b, "epoch %lld  ", static_cast<long long>(s.epoch + 1));
    text += b;
    if (s.total_steps > 0)
      std::snprintf(b, sizeof b, "step %*lld/%lld  ", width, static_cast<long long>(s.step),
                    static_cast<long long>(s.total_steps));
    else
      std::snprintf(b, sizeof b, "step %lld  ", static_cast<long long>(s.step));
    text += b;
    if (std::isfinite(s.loss)) {
      std::snprintf(b, sizeof b, "loss %.4f  ", s.loss);
      text += b;
    }
    if (std::isfinite(s.samples_per_s)) {
      std::snprintf(b, sizeof b, "%.0f samples/s  ", s.samples_per_s);
      text += b;
    }
    text += "ETA " + duration(eta);
    if (!s.note.empty()) text += "  " + s.note;
    return text;
  }

 private:
  static double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::FILE* out_;
  bool in_place_;
  bool drawn_ = false;
  std::int64_t last_step_ = -1;
  double last_time_ = 0;
  double sec_per_step_ = 0;
};

}  // namespace dtrain
