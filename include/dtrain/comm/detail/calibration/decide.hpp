// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what the calibration DECIDES, given what it measured. Pure functions of agreed
// inputs, so every rank computes the same table; nothing here times, allocates a buffer or
// talks to a transport.
//
// 1. The model's table (model_decisions): each band of sizes [2^k, 2^(k+1)) takes the candidate
//    the fitted cost model predicts fastest at the band's middle. How the model is applied (the
//    candidates, flat or over nodes) is a ModelView.
// 2. The probes' verdict (apply_probes): every size follows its nearest probe, and where that
//    probe measured the model's pick beaten beyond the noise (CalibrationProbe::beaten: more than
//    10% slower in the median and slower in 4 of 5 paired repetitions), its measured winner runs
//    instead. Above the probes a time budget cut, the model stands unless the last probe found it
//    wrong about that very algorithm (CalibrationProbe::mispriced).
//
// Why not trust the model alone: it knows nothing of ranks outnumbering cores, of where a
// hypervisor puts two vCPUs, or of a transport's warm-up; why not trust the lowest median alone:
// on a loaded machine it is chance (benchmarks/RESULTS.md, "Calibration and the automatic
// choice"). The measurements are in measure.hpp and probes.hpp; the stored form in ../tuning.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/topology.hpp>

namespace dtrain::detail {

/// How a communicator applies a cost model: the algorithms `automatic` may choose, in the order
/// that breaks ties, and the predicted seconds of one at a size (bytes per rank). Local value.
struct ModelView {
  int p = 1;
  std::vector<AllreduceAlgorithm> candidates;
  std::function<double(const CostModel&, AllreduceAlgorithm, std::size_t)> predict;

  /// The cheapest candidate at `bytes` other than `skip` (`skip` itself when there is none;
  /// predictions of 1e299 or more mean unavailable).
  AllreduceAlgorithm best(const CostModel& cm, std::size_t bytes,
                          AllreduceAlgorithm skip = AllreduceAlgorithm::automatic) const {
    AllreduceAlgorithm pick = skip == AllreduceAlgorithm::automatic ? candidates.front() : skip;
    double t = 1e299;
    for (AllreduceAlgorithm a : candidates) {
      if (a == skip) continue;
      const double ta = predict(cm, a, bytes);
      if (ta < t) {
        t = ta;
        pick = a;
      }
    }
    return pick;
  }
};

/// The view of p ranks without node structure: ring, rhd, rd, tree and shm (where measured),
/// predicted by CostModel::predict; best() then agrees with CostModel::best.
inline ModelView flat_model_view(int p) {
  ModelView v;
  v.p = p;
  v.candidates = {AllreduceAlgorithm::ring, AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd,
                  AllreduceAlgorithm::tree, AllreduceAlgorithm::shm};
  v.predict = [p](const CostModel& cm, AllreduceAlgorithm a, std::size_t bytes) {
    return cm.predict(a, bytes, p);
  };
  return v;
}

/// The view of p ranks grouped in nodes as `topo`: the flat candidates, hier and hier_leader
/// where the grouping is hierarchical, predicted by the four-argument CostModel::predict (shm
/// only on one node, whatever the model's shm terms say: with several nodes they are measured
/// inside a node, for hier). What a Communicator applies.
inline ModelView topology_model_view(int p, const Topology& topo) {
  ModelView v = flat_model_view(p);
  if (topo.hierarchical()) {
    v.candidates.push_back(AllreduceAlgorithm::hier);
    v.candidates.push_back(AllreduceAlgorithm::hier_leader);
  }
  v.predict = [p, topo](const CostModel& cm, AllreduceAlgorithm a, std::size_t bytes) {
    return cm.predict(a, bytes, p, topo);
  };
  return v;
}

/// The table the model alone gives under `view`. Pure.
inline AllreduceDecisions model_decisions(const CostModel& cm, const ModelView& view) {
  if (view.p <= 1) return {AllreduceDecision{0, AllreduceAlgorithm::ring}};
  return decisions_from([&](std::size_t b) { return view.best(cm, b); });
}

/// Repetitions a probe times each algorithm (every one in every repetition, probes.hpp).
inline constexpr int kProbeReps = 5;
/// Repetitions (of kProbeReps) in which a pick must have been slower than the probe's winner to be
/// replaced. Two samples from one distribution would pass in 6 of 32 orderings; with the median
/// condition too, a switch between algorithms that perform alike stays rare, while a pick that
/// was slower in every repetition but one lucky one is still replaced (kept under the earlier
/// rule, "even its fastest repetition slower than the winner's median", which one fast outlier
/// satisfied: at 256 KiB on 2 ranks a ring pick with median 312 us against shm's 160 us stood
/// because one of its repetitions took 138 us, and the bench then measured it 1.95x slower).
inline constexpr int kPairedLosses = kProbeReps - 1;
/// How much slower than a probe's winner (medians) the model's pick must have measured to be
/// replaced: a near tie is left to the model.
inline constexpr double kSwitchFactor = 1.1;
/// How far above its prediction an algorithm that a probe found beaten must have measured for
/// the model's pick of it to be overruled above the probes the time budget cut (apply_probes).
inline constexpr double kMispricedFactor = 1.5;

/// One validation probe at `bytes`: the model's pick and every available algorithm (the pick
/// first) predicted and measured (the agreed median of the slowest rank, seconds), each of their
/// repetitions, the measured winner, and whether it replaced the pick at `bytes`. Made by
/// probes.hpp, judged here.
struct CalibrationProbe {
  std::size_t bytes = 0;
  AllreduceAlgorithm pick = AllreduceAlgorithm::ring;
  AllreduceAlgorithm winner = AllreduceAlgorithm::ring;
  std::vector<AllreduceAlgorithm> algos;
  std::vector<double> predicted, measured;
  /// Every repetition of every algorithm (the slowest rank's), algorithm-major: reps[k *
  /// kProbeReps + i] is algorithm k in repetition i, which ran in the same round as every
  /// other algorithm's repetition i.
  std::vector<double> reps;
  bool replaced = false;
  /// Only the pick and the algorithms close to the previous probe's fastest (kNarrowFactor):
  /// the full probe would have exceeded the time budget.
  bool narrowed = false;
  int burst = 0;  // calls per repetition (probe_burst_calls of the pick's prediction)

  /// The fastest and the slowest of algorithm k's agreed repetitions (reports; 0 when not
  /// measured).
  double fastest(std::size_t k) const { return extreme(k, false); }
  double slowest(std::size_t k) const { return extreme(k, true); }

  /// Whether `algo`, measured here, lost to the winner beyond the noise: its median more than
  /// `factor` times the winner's, and slower than the winner in all repetitions but at most one
  /// (kPairedLosses of kProbeReps, each pair from one round). False for an algorithm not
  /// measured here.
  bool beaten(AllreduceAlgorithm algo, double factor) const {
    const auto n = algos.size(), reps_per = static_cast<std::size_t>(kProbeReps);
    const auto it = std::find(algos.begin(), algos.end(), algo);
    if (it == algos.end() || measured.size() != n || reps.size() != n * reps_per) return false;
    const auto k = static_cast<std::size_t>(it - algos.begin());
    const auto w =
        static_cast<std::size_t>(std::find(algos.begin(), algos.end(), winner) - algos.begin());
    if (w >= n || k == w || !(measured[k] > factor * measured[w])) return false;
    int losses = 0;
    for (std::size_t i = 0; i < reps_per; ++i)
      losses += reps[k * reps_per + i] > reps[w * reps_per + i] ? 1 : 0;
    return losses >= kPairedLosses;
  }

  /// Whether the model was wrong about `algo` here: measured, beaten (kSwitchFactor) and its
  /// median more than `factor` times its prediction. False for an algorithm not measured here.
  bool mispriced(AllreduceAlgorithm algo, double factor) const {
    const auto it = std::find(algos.begin(), algos.end(), algo);
    if (it == algos.end()) return false;
    const auto k = static_cast<std::size_t>(it - algos.begin());
    return k < measured.size() && k < predicted.size() && beaten(algo, kSwitchFactor) &&
           measured[k] > factor * predicted[k];
  }

 private:
  double extreme(std::size_t k, bool slowest) const {
    const auto per = static_cast<std::size_t>(kProbeReps);
    if (reps.size() < (k + 1) * per) return 0;
    const auto first = reps.begin() + static_cast<std::ptrdiff_t>(k * per);
    return slowest ? *std::max_element(first, first + kProbeReps)
                   : *std::min_element(first, first + kProbeReps);
  }
};

/// The validated table: every size below `validated_to` follows its nearest probe (the band
/// from the geometric middle with the previous probe to that with the next; the first band from
/// 0, the last up to `validated_to`): where that probe measured the model's pick beaten beyond
/// the noise (CalibrationProbe::beaten), its measured winner runs instead. From `validated_to`
/// up the model's pick stands: the probes were cut there (Calibration::validated_to), and a
/// probe below 4 MiB does not stand for the bandwidth-bound sizes above it as the 4 MiB probe
/// does; unless the last probe taken found the model wrong about that very algorithm (beaten,
/// and measured more than kMispricedFactor times its prediction: CalibrationProbe::mispriced),
/// where that probe's winner runs instead. (On 2x2 fake nodes under load the 1 MiB probe
/// measured ring at 2.9x its prediction and replaced it, the 4 MiB probe was cut, and the
/// model's ring from 2 MiB up ran 2.6x slower than hier_leader at 4 MiB.) Pure; every rank
/// computes the same from the same agreed inputs.
inline AllreduceDecisions apply_probes(const CostModel& cm, const ModelView& view,
                                       const std::vector<CalibrationProbe>& probes,
                                       double validated_to = 1e300) {
  auto pick = [&](std::size_t b) {
    const AllreduceAlgorithm a = view.best(cm, b);
    for (std::size_t k = 0; k < probes.size(); ++k) {
      const CalibrationProbe& q = probes[k];
      const double lo = k == 0 ? 0.0 : std::sqrt(double(probes[k - 1].bytes) * double(q.bytes));
      const double hi = k + 1 == probes.size()
                            ? validated_to
                            : std::sqrt(double(q.bytes) * double(probes[k + 1].bytes));
      if (double(b) >= lo && double(b) < hi) return q.beaten(a, kSwitchFactor) ? q.winner : a;
    }
    if (!probes.empty() && probes.back().mispriced(a, kMispricedFactor))
      return probes.back().winner;
    return a;
  };
  if (view.p <= 1) return model_decisions(cm, view);
  return decisions_from(pick);
}

}  // namespace dtrain::detail
