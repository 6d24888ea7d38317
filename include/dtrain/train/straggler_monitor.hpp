// SPDX-License-Identifier: BSD-3-Clause
// dtrain: StragglerMonitor, per-rank timings written by every rank, the slowest rank named.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/train/csv_log.hpp>

namespace dtrain {

/// Seconds one rank spent in each phase over an interval of steps.
struct PhaseTimes {
  double compute_s = 0;    ///< forward, backward and optimizer
  double data_wait_s = 0;  ///< waiting for the next batch
  double sync_wait_s = 0;  ///< waiting for the gradient average
};

/// What the ranks learned about an interval (the same on every rank).
struct StragglerReport {
  int slowest_rank = -1;
  double slowest_busy_s = 0;  ///< compute + data wait of the slowest rank
  double median_busy_s = 0;   ///< median over ranks of compute + data wait
  bool lagging = false;       ///< slowest exceeds the median by more than the threshold
  /// Relative excess of the slowest rank over the median (0.25 = 25% slower).
  double excess() const noexcept {
    return median_busy_s > 0 ? slowest_busy_s / median_busy_s - 1.0 : 0.0;
  }
  /// "slowest: rank 3, +25% vs median" when lagging, otherwise empty.
  std::string describe() const {
    if (!lagging) return "";
    char b[96];
    std::snprintf(b, sizeof b, "slowest: rank %d, +%.0f%% vs median", slowest_rank,
                  100.0 * excess());
    return b;
  }
};

/// Straggler telemetry. Every rank appends its own per-interval compute, data-wait and sync-wait
/// seconds to its own CSV (`csv_path`, e.g. RUN/timing-rank-00003.csv), and exchange() shares
/// them (one allgather of 3 doubles per rank) so every rank knows the slowest one. A rank is
/// "busy" for compute + data wait; sync wait is excluded, since the ranks that wait are the fast
/// ones. exchange() is collective over `comm` and must be called at the same step on every rank;
/// blocking; not thread-safe. The communicator needs allgather(BufferView in, BufferView out),
/// rank() and size().
template <class Comm>
class StragglerMonitor {
 public:
  /// `csv_path` empty: no file. `keep_through_step`: see CsvLog. `threshold`: relative excess over
  /// the median above which a rank is reported (0.10 = 10%).
  StragglerMonitor(Comm& comm, const std::string& csv_path, std::int64_t keep_through_step,
                   double threshold = 0.10)
      : comm_(comm), threshold_(threshold) {
    if (!csv_path.empty())
      csv_ = CsvLog(csv_path,
                    {"step", "rank", "interval_steps", "compute_s", "data_wait_s", "sync_wait_s"},
                    keep_through_step);
    all_.resize(3 * static_cast<std::size_t>(comm_.size()));
  }

  /// Collective. Records this rank's `times` for the `steps` steps that ended at `step`.
  StragglerReport exchange(std::int64_t step, std::int64_t steps, const PhaseTimes& times) {
    if (csv_.is_open())
      csv_.row({static_cast<double>(step), static_cast<double>(comm_.rank()),
                static_cast<double>(steps), times.compute_s, times.data_wait_s, times.sync_wait_s});
    double mine[3] = {times.compute_s, times.data_wait_s, times.sync_wait_s};
    comm_.allgather(BufferView(mine, 3, DType::f64),
                    BufferView(all_.data(), all_.size(), DType::f64));
    return analyse(all_, threshold_);
  }

  /// The last interval's times of every rank: [rank][compute, data wait, sync wait].
  const std::vector<double>& all_times() const noexcept { return all_; }

  /// The report for gathered times (3 per rank). Pure function, exposed for tests.
  static StragglerReport analyse(const std::vector<double>& all, double threshold) {
    StragglerReport r;
    const std::size_t p = all.size() / 3;
    if (p == 0) return r;
    std::vector<double> busy(p);
    for (std::size_t i = 0; i < p; ++i) busy[i] = all[3 * i] + all[3 * i + 1];
    const auto it = std::max_element(busy.begin(), busy.end());
    r.slowest_rank = static_cast<int>(it - busy.begin());
    r.slowest_busy_s = *it;
    std::vector<double> sorted = busy;
    std::sort(sorted.begin(), sorted.end());
    r.median_busy_s = p % 2 ? sorted[p / 2] : 0.5 * (sorted[p / 2 - 1] + sorted[p / 2]);
    r.lagging =
        p > 1 && r.median_busy_s > 0 && r.slowest_busy_s > (1.0 + threshold) * r.median_busy_s;
    return r;
  }

 private:
  Comm& comm_;
  double threshold_;
  CsvLog csv_;
  std::vector<double> all_;
};

}  // namespace dtrain
