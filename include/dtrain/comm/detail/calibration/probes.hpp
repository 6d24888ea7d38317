// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the calibration's probes, what it MEASURES to check the model's table: every available
// algorithm timed at 4 KiB to 4 MiB, a factor 4 apart (decide.hpp judges the outcome).
//
// A probe times what the communicator will run afterwards, in each algorithm's steady state:
// - the plans are built with the model under validation in place (hier and hier_leader take
//   their algorithm between nodes from it), on an input and an output at one page offset;
// - every algorithm first runs unmeasured warm-up calls (probe_warm_calls: a transport may reach
//   its steady state only after a hundred messages between two ranks);
// - then kProbeReps repetitions, each a burst of calls back to back (probe_burst_calls, about
//   150 us by the model, 3 to 32), after one untimed call with the waits' memory of contention
//   cleared; the algorithms' order changes each repetition so that every algorithm follows each
//   other one (balanced_order);
// - every algorithm's median and every repetition are agreed (the slowest rank's).
// A probe that a time budget would exceed runs narrowed to the model's pick and the algorithms
// close to the previous probe's fastest where that fits, else it and every larger one are
// skipped (a slow transport would spend minutes on them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/calibration/decide.hpp>
#include <dtrain/comm/detail/calibration/timing.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Probe sizes (bytes of f32 per rank), a factor 4 apart from latency- to bandwidth-bound, so
/// that every crossover lies within a factor 2 of a probe. (No larger probe: at 8 MiB the
/// validation cost about ten times the rest of the calibration, seconds with 4 loopback ranks
/// on 2 cores; the budget below skips the 4 MiB probe where the 1 MiB one was already slow. The
/// last probe's band reaches to the largest size, or where the budget skipped probes, to the
/// middle between the last one taken and the first one skipped.)
inline constexpr std::size_t kProbeBytes[] = {4096, 16384, 65536, 262144, 1u << 20, 4u << 20};

/// Calls per probe repetition, back to back (the repetition's sample is their mean): at least
/// kProbeBurst, more where the model predicts a call shorter than kProbeBurstSeconds / kProbeBurst
/// (probe_burst_calls). A single call right after another algorithm's starts with the ranks in
/// step; back-to-back calls, as a training step's buckets and allreduce_bench run them, let a
/// lock-step algorithm (shm) fall out of step when a rank is descheduled: at 1-16 MiB on a
/// loaded 2-core machine single calls measured shm level with ring where the bench measured it
/// 3x slower. For calls of a few microseconds the first call of a burst pays for waking the
/// partners (a rank that waited through the previous algorithm's calls may sleep in the kernel,
/// tens of microseconds), which three calls do not amortise: at 4 KiB on 2 ranks, 3-call probes
/// measured rd 19.6 us and shm 34.3 us (medians) where the bench, 5 calls per round, measured
/// 7.3 and 6.2, and the table kept rd (benchmarks/RESULTS.md).
inline constexpr int kProbeBurst = 3;
inline constexpr int kProbeBurstMax = 32;
inline constexpr double kProbeBurstSeconds = 150e-6;
/// Calls per probe repetition for a call the model predicts to take `predicted` seconds:
/// kProbeBurstSeconds worth, between kProbeBurst and kProbeBurstMax. Pure; every rank computes
/// the same from the agreed model.
inline int probe_burst_calls(double predicted) noexcept {
  if (!(predicted > 0)) return kProbeBurstMax;
  const double calls = std::ceil(kProbeBurstSeconds / predicted);
  return calls >= kProbeBurstMax ? kProbeBurstMax : std::max(kProbeBurst, static_cast<int>(calls));
}

/// Unmeasured calls of each algorithm before a probe times it: kProbeWarmSeconds worth by the
/// model's prediction for that algorithm, between 1 and kProbeWarmMax. One call touches the
/// buffers and opens the connections, but a transport may reach its steady state only after many
/// messages between the same two ranks: MPICH over UCX's shared-memory transport (Debian 12)
/// takes page faults on its message queue's pages as they are first used, and messages of 4 to
/// 8 KB needed 100-130 exchanges with a partner (about 200 minor faults, 3.9 ms) before the time of
/// one fell from 40-50 us to 1.3-2 us; smaller messages and rendezvous-sized ones were at their
/// steady state after a few (benchmarks/RESULTS.md). Probes that time such a warm-up measure
/// the algorithm that sends those messages (rd at 4 KiB on 2 ranks) slower than it runs once
/// warm, and its later calls slow or fast depending on how far the probes got through it.
inline constexpr int kProbeWarmMax = 160;
inline constexpr double kProbeWarmSeconds = 1e-3;
/// Warm-up calls before a probe of an algorithm predicted to take `predicted` seconds a call.
/// Pure; every rank computes the same from the agreed model.
inline int probe_warm_calls(double predicted) noexcept {
  if (!(predicted > 0)) return 1;
  const double calls = std::floor(kProbeWarmSeconds / predicted);
  return calls >= kProbeWarmMax ? kProbeWarmMax : std::max(1, static_cast<int>(calls));
}

/// Wall-time budget of one validation probe size (all its algorithms and repetitions).
inline constexpr double kProbeBudgetSeconds = 0.5;
/// A probe the budget would skip runs narrowed instead where that fits the budget: the model's
/// pick and the algorithms the previous probe measured within this factor of its fastest (4
/// ranks on 2 cores skipped the 4 MiB probe of every algorithm, 2x2 fake nodes that one and at
/// times the 1 MiB one, and the model alone then chose between hier and hier_leader, which lie
/// 1.1-1.5x apart there; benchmarks/RESULTS.md).
inline constexpr double kNarrowFactor = 1.5;
/// Test knob: that budget (kProbeBudgetSeconds unless set). Tests whose samples come from
/// calibration_hook() lift it, so that which probes run does not depend on how fast the machine
/// (or a sanitizer build) executes them. Set it before any rank calibrates.
inline double& calibration_probe_budget() {
  static double budget = kProbeBudgetSeconds;
  return budget;
}

/// The order in which repetition `row` times `n` algorithms (a permutation of 0..n-1): a Williams
/// design, balanced for the one before. Over n rows (even n; 2n for odd n, the rows and their
/// reverses) each algorithm follows every other one equally often, where a rotation made it
/// follow the same one in every row; what an algorithm leaves behind then weighs on all the
/// others alike (on 2x2 fake nodes hier ran about 15% slower right after tree than after rd at
/// 16 KiB; benchmarks/RESULTS.md). Pure.
inline std::vector<std::size_t> balanced_order(std::size_t n, std::size_t row) {
  std::vector<std::size_t> order(n);
  if (n == 0) return order;
  const bool odd = n % 2 == 1;
  const std::size_t r = row % (odd ? 2 * n : n);
  std::size_t lo = 0, hi = n;
  for (std::size_t j = 0; j < n; ++j) {  // 0, n-1, 1, n-2, ...: every step a different distance
    const std::size_t first = j % 2 == 0 ? lo++ : --hi;
    order[j] = (first + r) % n;
  }
  if (odd && r >= n) std::reverse(order.begin(), order.end());
  return order;
}

/// The algorithms of a narrowed probe: `pick` first, then those of `available` that the previous
/// probe (`prev_algos`, their agreed medians `prev_med`) measured within kNarrowFactor of its
/// fastest, in the previous probe's order. Pure; every rank computes the same from agreed inputs.
inline std::vector<AllreduceAlgorithm> narrowed_probe(
    const std::vector<AllreduceAlgorithm>& available, AllreduceAlgorithm pick,
    const std::vector<AllreduceAlgorithm>& prev_algos, const std::vector<double>& prev_med) {
  std::vector<AllreduceAlgorithm> close{pick};
  if (prev_med.empty() || prev_med.size() != prev_algos.size()) return close;
  const double fastest = *std::min_element(prev_med.begin(), prev_med.end());
  for (std::size_t k = 0; k < prev_algos.size(); ++k)
    if (prev_algos[k] != pick && prev_med[k] <= kNarrowFactor * fastest &&
        std::find(available.begin(), available.end(), prev_algos[k]) != available.end())
      close.push_back(prev_algos[k]);
  return close;
}

/// The share of the previous probe's time that `algos` would take: the sum of their medians
/// there over the sum of all (an algorithm it did not time counts as its mean), so 1 for the same
/// algorithms; scales the previous probe's wall time to a probe of `algos`. Pure.
inline double probe_share(const std::vector<AllreduceAlgorithm>& algos,
                          const std::vector<AllreduceAlgorithm>& prev_algos,
                          const std::vector<double>& prev_med) {
  if (prev_med.empty() || prev_med.size() != prev_algos.size()) return 1;
  double total = 0;
  for (double m : prev_med) total += m;
  if (!(total > 0)) return 1;
  const double mean = total / static_cast<double>(prev_med.size());
  double share = 0;
  for (AllreduceAlgorithm a : algos) {
    const auto it = std::find(prev_algos.begin(), prev_algos.end(), a);
    share +=
        it == prev_algos.end() ? mean : prev_med[static_cast<std::size_t>(it - prev_algos.begin())];
  }
  return share / total;
}

/// What the probes measured: one CalibrationProbe per probe size taken (winner set, `replaced`
/// judged), and the bytes per rank from which the table is the model's alone (the geometric
/// middle between the last probe taken and the first one the budget skipped; 1e300 when none
/// was skipped).
struct ProbeResults {
  std::vector<CalibrationProbe> probes;
  double validated_to = 1e300;
};

/// The probes over a communicator's transport (collective: every rank runs run() at the same
/// point). Used once, by calibrate().
template <class Transport>
class ProbeMeasurement : CalibrationStep<Transport> {
  using Base = CalibrationStep<Transport>;
  using Base::agree_max;
  using Base::allreduce_spec;
  using Base::sample;
  using Base::st_;
  using Base::t_;
  using typename Base::Plan;

 public:
  explicit ProbeMeasurement(CommState<Transport>& st) : Base(st) {}

  /// Times the probes of `model` (whose table under `view` is `decisions`). Collective.
  ProbeResults run(const CostModel& model, const AllreduceDecisions& decisions,
                   const ModelView& view) {
    ProbeResults out;
    // The probes' plans are built as the communicator's will be once this model is in place:
    // hier and hier_leader take their algorithm between nodes from the communicator's model,
    // and without one fall back to ring and rd, which the probes then timed instead of what
    // ran afterwards (on 2x2 fake nodes hier_leader's leaders ran rd in the probes and ring
    // after: 5.3 ms against 3.4 at 4 MiB; benchmarks/RESULTS.md). Restored on the way out.
    struct Installed {
      CostModel& slot;
      CostModel saved;
      ~Installed() { slot = saved; }
    } installed{st_.cost, st_.cost};
    st_.cost = model;
    const std::size_t max_bytes =
        std::min(kProbeBytes[std::size(kProbeBytes) - 1], calibration_probe_limit());
    // Input and output at the same offset within a page, as two buffers from one allocator (or
    // one buffer in place) usually are: shm places its chunks by the output's offset
    // (algo/shm.hpp), so a probe on buffers a few bytes apart modulo a page would time shm's copy
    // into its slots at a destination offset a few bytes above its source, which the usual case
    // does not see.
    const std::size_t probe_count = max_bytes / sizeof(float);
    constexpr std::size_t kPageFloats = 4096 / sizeof(float);
    CalibrationFloats probe_mem(calibration_allocator(node_segments_of(t_)),
                                2 * probe_count + kPageFloats, 1.0f);
    float* const probe_in = probe_mem.data();
    float* const probe_out = probe_in + (probe_count + kPageFloats - 1) / kPageFloats * kPageFloats;
    std::vector<double> med;  // every probe's algorithms in order: their medians
    std::vector<double> all;  // ... and each of their repetitions
    // The previous probe: its wall time per call of a burst and each algorithm's median, agreed
    // (slowest rank), so every rank takes the same decisions below.
    double spent = 0;
    std::size_t spent_bytes = 0;
    std::vector<AllreduceAlgorithm> prev_algos;
    std::vector<double> prev_med;
    for (std::size_t bytes : kProbeBytes) {
      if (bytes > max_bytes) break;
      const AllreduceAlgorithm pick = lookup_decision(decisions, bytes);
      // The burst length follows the model's pick, its fastest prediction (every rank alike).
      const int burst = probe_burst_calls(view.predict(model, pick, bytes));
      CalibrationProbe q;
      q.bytes = bytes;
      q.pick = pick;
      q.burst = burst;
      q.algos.push_back(q.pick);
      for (AllreduceAlgorithm a : view.candidates)
        if (a != q.pick && view.predict(model, a, bytes) < 1e299) q.algos.push_back(a);
      // A slow transport (MPI-RMA through a software progress path, more ranks than cores)
      // would spend minutes on the larger probes: a probe whose cost, extrapolated from the
      // previous one linearly in size and in calls per burst, and by the share of its time the
      // algorithms taken spent there (probe_share), exceeds the budget runs narrowed
      // (kNarrowFactor) where that fits, else is skipped with every larger one. The model's
      // table then stands unvalidated from the middle between the last probe taken and this
      // one (validated_to).
      const auto cost = [&](const std::vector<AllreduceAlgorithm>& algos) {
        return spent * probe_share(algos, prev_algos, prev_med) * burst *
               static_cast<double>(bytes) / static_cast<double>(spent_bytes);
      };
      if (spent_bytes && cost(q.algos) > calibration_probe_budget()) {
        std::vector<AllreduceAlgorithm> close =
            narrowed_probe(q.algos, q.pick, prev_algos, prev_med);
        if (close.size() < 2 || cost(close) > calibration_probe_budget()) {
          out.validated_to =
              std::sqrt(static_cast<double>(spent_bytes) * static_cast<double>(bytes));
          break;
        }
        q.algos = std::move(close);
        q.narrowed = true;
      }
      const std::size_t n = q.algos.size();
      std::vector<std::unique_ptr<Plan>> plans;
      for (AllreduceAlgorithm a : q.algos) {
        q.predicted.push_back(view.predict(model, a, bytes));
        plans.push_back(std::make_unique<Plan>(
            st_, allreduce_spec(a, DType::f32, probe_in, probe_out, bytes / sizeof(float))));
        const int warm = probe_warm_calls(q.predicted.back());
        for (int i = 0; i < warm; ++i) execute_in_order(st_, *plans.back());
      }
      // The budget extrapolates the timed repetitions only: the warm-up's calls are bounded by
      // the prediction (kProbeWarmSeconds each), and counting them skipped the 16-256 KiB probes
      // of 2x2 fake nodes on 2 cores, whose calls run at a few times their prediction.
      const double probe_start = now_seconds();
      std::vector<std::vector<double>> times(n);
      for (int rep = 0; rep < kProbeReps; ++rep) {
        const std::vector<std::size_t> order = balanced_order(n, static_cast<std::size_t>(rep));
        for (std::size_t j = 0; j < n; ++j) {
          const std::size_t k = order[j];
          // In the algorithm's own steady state: without the memory of contention that the
          // previous burst's waits may have left (it outlasts a burst, and MPI's waits sleep
          // between polls while it lasts), and after one untimed call whose waits set it again
          // if this algorithm finds the cores contended. Carried over, it timed each algorithm
          // in its predecessor's state (benchmarks/RESULTS.md).
          forget_contention();
          execute_in_order(st_, *plans[k]);
          const double t0 = now_seconds();
          for (int i = 0; i < burst; ++i) execute_in_order(st_, *plans[k]);
          times[k].push_back(sample(CalibrationQuantity::probe, rep, (now_seconds() - t0) / burst,
                                    q.algos[k], bytes));
        }
      }
      for (const auto& t : times) {
        med.push_back(median_of(t));
        all.insert(all.end(), t.begin(), t.end());
      }
      prev_algos = q.algos;
      prev_med.assign(med.end() - static_cast<std::ptrdiff_t>(n), med.end());
      prev_med.push_back((now_seconds() - probe_start) / burst);
      agree_max(prev_med.data(), prev_med.size());
      spent = prev_med.back();
      prev_med.pop_back();
      spent_bytes = bytes;
      out.probes.push_back(std::move(q));
    }
    // Every probe's figures agreed at once (the slowest rank's), then each probe's winner.
    const std::size_t n_med = med.size();
    med.insert(med.end(), all.begin(), all.end());
    agree_max(med.data(), med.size());
    std::size_t at = 0;
    for (CalibrationProbe& q : out.probes) {
      q.measured.assign(med.begin() + at, med.begin() + at + q.algos.size());
      const auto r0 = n_med + at * static_cast<std::size_t>(kProbeReps);
      q.reps.assign(med.begin() + r0, med.begin() + r0 + q.algos.size() * kProbeReps);
      at += q.algos.size();
      std::size_t w = 0;
      for (std::size_t k = 1; k < q.measured.size(); ++k)
        if (q.measured[k] < q.measured[w]) w = k;
      q.winner = q.algos[w];
      q.replaced = q.beaten(q.pick, kSwitchFactor);
    }
    return out;
  }
};

}  // namespace dtrain::detail
