// SPDX-License-Identifier: BSD-3-Clause
// dtrain: how often to checkpoint. The first-order model of Young (1974) and Daly (2006): a run
// saves for C seconds after every T seconds of work and fails at random with a mean time between
// failures M; a failure costs the restart R plus, on average, half of the last period.
// Plain arithmetic, no dependencies.
#pragma once

#include <cmath>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// What a checkpoint interval costs under the model (all times in seconds).
struct CheckpointIntervalCost {
  double interval = 0;  ///< T: work between two saves
  /// Expected time lost to one failure: R + (T + C) / 2 (the restart, and half of the period the
  /// failure hits, spent again).
  double lost_per_failure = 0;
  /// Expected fraction of the run's time that is not new work: saves, C / (T + C), plus failures,
  /// (R + (T + C) / 2) / M. First order in (T + C) / M: meaningful while that is well below 1.
  double overhead = 0;
};

/// The cost of saving every `interval` seconds of work when a save takes `save` seconds, a
/// restart `restart` seconds, and failures come every `mtbf` seconds on average (the whole job's
/// MTBF: a node's divided by the node count). Throws InvalidArgument on a negative time or a
/// non-positive interval or MTBF.
inline CheckpointIntervalCost checkpoint_interval_cost(double interval, double save, double restart,
                                                       double mtbf) {
  DTRAIN_REQUIRE(interval > 0 && save >= 0 && restart >= 0 && mtbf > 0, "checkpoint_interval_cost",
                 "interval " << interval << " s, save " << save << " s, restart " << restart
                             << " s, MTBF " << mtbf << " s");
  CheckpointIntervalCost c;
  c.interval = interval;
  c.lost_per_failure = restart + 0.5 * (interval + save);
  c.overhead = save / (interval + save) + c.lost_per_failure / mtbf;
  return c;
}

/// The interval of work between saves that minimises the overhead: Daly's higher-order estimate
/// sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C for C < 2M, and M otherwise; Young's
/// sqrt(2 C M) is its first term. Returns the cost of that interval. The save time must be
/// positive (free saves would mean saving after every step).
inline CheckpointIntervalCost optimal_checkpoint_interval(double save, double restart,
                                                          double mtbf) {
  DTRAIN_REQUIRE(save > 0 && restart >= 0 && mtbf > 0, "optimal_checkpoint_interval",
                 "save " << save << " s, restart " << restart << " s, MTBF " << mtbf << " s");
  const double t = save < 2 * mtbf
                       ? std::sqrt(2 * save * mtbf) *
                                 (1 + std::sqrt(save / (2 * mtbf)) / 3 + save / (18 * mtbf)) -
                             save
                       : mtbf;
  return checkpoint_interval_cost(t, save, restart, mtbf);
}

}  // namespace dtrain
