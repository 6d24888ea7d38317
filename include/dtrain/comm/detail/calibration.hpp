// dtrain: measuring the alpha-beta-gamma cost model and the decision table that `automatic`
// all-reduce follows (Communicator::cost_model). Collective.
//
// Robust against a noisy machine in three ways:
// 1. Interleaved rounds, robust statistic. The quantities (a ping-pong with partner r^1 for
//    alpha, a 4 MiB exchange for beta, a local 4 MiB reduction for gamma, a one-chunk and a 4 MiB
//    shm all-reduce where there are node-shared segments (over the whole group on one node; with
//    several nodes among each node's ranks on its segments, as hier uses them), and with several
//    nodes a ping-pong and a 4 MiB exchange between the first ranks of nodes 2k and 2k+1 for
//    inter_alpha and inter_beta, and where nodes have several ranks the same exchange between
//    every rank and its counterpart there, all pairs at once, for inter_share; a one-element rd
//    all-reduce for the fixed cost of a call; on a node's first rank, in the first three rounds,
//    copies of working sets from 8 to 64 MiB, whose first and last give the factor by which
//    per-byte costs grow once a node's working set leaves the cache, and whose knee says where
//    it leaves it: kCopyFirstBytes, cache_knee) are measured
//    once per round, one after the other, for kRounds rounds; each quantity takes the median over
//    the rounds (a latency sample is the minimum of a short burst), so a burst of load from another
//    process spoils at most a round or two of each quantity, not the result. The exception is the
//    nodes' leaders' exchange (inter_beta), a single pair's transfer: its fastest round.
// 2. Agreement. Every rank's medians are combined by a max all-reduce, so every rank computes
//    the same model, bit for bit, and hence the same decision table.
// 3. Validation. The model's table is checked at probe sizes 4 KiB to 4 MiB, a factor 4 apart,
//    with the model in place, so the probes' plans are built as the communicator's will be:
//    every available algorithm runs unmeasured warm-up calls (probe_warm_calls), then
//    kProbeReps times (each a burst of calls back to back, as many as make about 150 us by the
//    model, 3 to 32, after one untimed call with the waits' memory of contention cleared), in
//    an order that changes each repetition so that every algorithm follows each other one
//    (balanced_order); each
//    algorithm's median, fastest and slowest and every repetition are agreed like the model (the
//    slowest rank's). A probe that the time budget would skip runs narrowed to the model's pick
//    and the algorithms close to the previous probe's fastest where that fits the budget. Each
//    size then follows its nearest probe (bands between geometric middles; above the probes a
//    time budget skipped, the model alone):
//    where the model's pick for that size measured more than kSwitchFactor (10%) slower than the
//    probe's fastest algorithm (medians), and slower than it in at least 4 of the 5
//    repetitions taken pair by pair (a difference beyond the noise), the prediction is taken as
//    wrong and the measured winner replaces it. Neither one descheduled repetition of the winner
//    nor one lucky repetition of the pick decides: an earlier test on extremes was fooled by either
//    (the winner's slowest repetition kept shm at 1 MiB, 1.5x slower than ring, in two of five
//    quiet 2-rank runs; the pick's fastest kept ring at 256 KiB, 1.95x slower than shm).
//    All algorithms, not just the model's runner-up, because a model fitted on a loaded machine
//    can be wrong by more than the gap between its first and second choice.
// Estimated 0.1 s at 2 ranks on an idle 2-core machine; seconds when the machine is heavily
// loaded (allreduce_bench prints the time; benchmarks/RESULTS.md).
//
// The buffers of the point-to-point measurements are registered with the transport first, as a
// plan registers its own, so that a transport which requires registration is measured as it is
// used.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/collective_plan.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Memory registered with a transport for the lifetime of this object.
template <class Transport>
class ScopedRegistration {
 public:
  ScopedRegistration(Transport& t, void* data, std::size_t bytes)
      : t_(&t), region_(t.register_memory(data, bytes, Space::host)) {}
  ~ScopedRegistration() { t_->deregister_memory(region_); }
  ScopedRegistration(const ScopedRegistration&) = delete;
  ScopedRegistration& operator=(const ScopedRegistration&) = delete;
  const MemoryRegion& region() const noexcept { return region_; }

 private:
  Transport* t_;
  MemoryRegion region_;
};

/// What one raw calibration timing measured.
enum class CalibrationQuantity {
  alpha,         // half a ping-pong (minimum of a burst)
  beta,          // one 4 MiB exchange
  gamma,         // one local 4 MiB reduction
  shm_alpha,     // one one-chunk shm all-reduce (minimum of a burst)
  shm_beta,      // one 4 MiB shm all-reduce
  inter_alpha,   // half a ping-pong between the first ranks of two nodes (minimum of a burst)
  inter_beta,    // one 4 MiB exchange between them
  inter_shared,  // one 4 MiB exchange of local rank l of node 2k with local rank l of node
                 // 2k+1, every such pair at once (nodes of several ranks)
  call,          // one one-element rd all-reduce (minimum of a burst): the fixed cost of a call
  copy_cache,    // one local 4 MiB copy, a working set in any last-level cache (a node's first
                 // rank), per byte
  copy_memory,   // one local copy of a larger working set (`bytes`: 16 to 64 MiB), per byte
  probe          // one validation run of `algo` at `bytes`
};

/// One raw timing, as the test hook sees it.
/// Floats for the calibration's shm measurements and probes, from `alloc` (filled with `value`).
/// The calibration takes them from the transport's node-shared heap where there is one: a model
/// built on Communicator::shared_allocator() keeps its gradients there, which the shm all-reduce
/// (and hier, hier_leader inside a node) reads in place (about half the passes over the data of
/// buffers elsewhere), so that is the shm to price. Without a heap, or where it is full, they
/// are host memory as before.
class CalibrationFloats {
 public:
  CalibrationFloats(Allocator& alloc, std::size_t n, float value)
      : alloc_(&alloc), n_(n), p_(static_cast<float*>(alloc.allocate(n * sizeof(float), 64))) {
    std::fill(p_, p_ + n_, value);
  }
  ~CalibrationFloats() { alloc_->deallocate(p_, n_ * sizeof(float)); }
  CalibrationFloats(const CalibrationFloats&) = delete;
  CalibrationFloats& operator=(const CalibrationFloats&) = delete;
  float* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  float* begin() const noexcept { return p_; }
  float* end() const noexcept { return p_ + n_; }

 private:
  Allocator* alloc_;
  std::size_t n_;
  float* p_;
};

/// The allocator the calibration's shm buffers come from (see CalibrationFloats).
inline Allocator& calibration_allocator(const SharedSegments* seg) noexcept {
  return seg && seg->heap_allocator ? *seg->heap_allocator : default_allocator();
}

struct CalibrationSample {
  int rank = 0;
  CalibrationQuantity quantity = CalibrationQuantity::alpha;
  int round = 0;  // round (model quantities) or repetition (probes)
  AllreduceAlgorithm algo = AllreduceAlgorithm::ring;
  std::size_t bytes = 0;
  double seconds = 0;
};

/// Test hook: when set, every raw timing of every calibration in the process passes through it
/// and the value it returns is used instead (tests inject slow samples, or replace all of them
/// by synthetic ones so that decisions are exactly predictable). Set it before any rank
/// calibrates and clear it after; called concurrently from every rank's thread.
inline std::function<double(const CalibrationSample&)>& calibration_hook() {
  static std::function<double(const CalibrationSample&)> hook;
  return hook;
}

/// Test knob: probes larger than this are skipped (tests keep calibrations short with it; set
/// it before any rank calibrates).
inline std::size_t& calibration_probe_limit() {
  static std::size_t limit = ~std::size_t{0};
  return limit;
}

/// One validation probe at `bytes`: the model's pick, its runner-up under the model, every
/// available algorithm (the pick first) predicted and measured (the agreed median of the
/// slowest rank, seconds), the measured winner, and whether it replaced the pick at `bytes`.
struct CalibrationProbe {
  std::size_t bytes = 0;
  AllreduceAlgorithm pick = AllreduceAlgorithm::ring, runner_up = AllreduceAlgorithm::ring;
  AllreduceAlgorithm winner = AllreduceAlgorithm::ring;
  std::vector<AllreduceAlgorithm> algos;
  std::vector<double> predicted, measured;
  std::vector<double> slowest;  // each algorithm's slowest repetition (the slowest rank's)
  std::vector<double> fastest;  // each algorithm's fastest repetition (the slowest rank's)
  /// Every repetition of every algorithm (the slowest rank's), algorithm-major: reps[k *
  /// kProbeReps + i] is algorithm k in repetition i, which ran in the same round as every
  /// other algorithm's repetition i.
  std::vector<double> reps;
  bool replaced = false;
  /// Only the pick and the algorithms close to the previous probe's fastest (kNarrowFactor):
  /// the full probe would have exceeded the time budget.
  bool narrowed = false;
  int burst = 0;  // calls per repetition (probe_burst_calls of the pick's prediction)

  /// Whether `algo`, measured here, lost to the winner beyond the noise: its median more than
  /// `factor` times the winner's, and slower than the winner in all repetitions but at most one
  /// (kPairedLosses of kProbeReps, each pair from one round). False for an algorithm not
  /// measured here.
  bool beaten(AllreduceAlgorithm algo, double factor) const;
  /// Whether the model was wrong about `algo` here: measured, beaten (kSwitchFactor) and its
  /// median more than `factor` times its prediction. False for an algorithm not measured here.
  bool mispriced(AllreduceAlgorithm algo, double factor) const;
};

/// The outcome of a calibration: the agreed model, the validated decision table, the probes.
struct Calibration {
  CostModel model;
  AllreduceDecisions decisions;
  std::vector<CalibrationProbe> probes;
  /// Bytes per rank from which the table is the model's alone: where the time budget skipped
  /// the remaining probes, the geometric middle between the last probe taken and the first one
  /// skipped; 1e300 when no probe was skipped for time.
  double validated_to = 1e300;
  double seconds = 0;  // wall time the calibration took on this rank
};

/// The last calibration this thread measured (a copy, for reports such as allreduce_bench's
/// probe table; each loopback rank is a thread of its own). Empty before the first.
inline Calibration& last_calibration() {
  thread_local Calibration c;
  return c;
}

inline constexpr int kRounds = 5;
inline constexpr int kProbeReps = 5;
/// Repetitions (of kProbeReps) in which a pick must have been slower than the probe's winner to be
/// replaced. Two samples from one distribution would pass in 6 of 32 orderings; with the median
/// condition too, a switch between algorithms that perform alike stays rare, while a pick that
/// was slower in every repetition but one lucky one is still replaced (kept under the earlier
/// rule, "even its fastest repetition slower than the winner's median", which one fast outlier
/// satisfied: at 256 KiB on 2 ranks a ring pick with median 312 us against shm's 160 us stood
/// because one of its repetitions took 138 us, and the bench then measured it 1.95x slower).
inline constexpr int kPairedLosses = kProbeReps - 1;
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
inline constexpr double kSwitchFactor = 1.1;
/// How far above its prediction an algorithm that a probe found beaten must have measured for
/// the model's pick of it to be overruled above the probes the time budget cut (apply_probes).
inline constexpr double kMispricedFactor = 1.5;
/// Probe sizes (bytes of f32 per rank), a factor 4 apart from latency- to bandwidth-bound, so
/// that every crossover lies within a factor 2 of a probe. (No larger probe: at 8 MiB the
/// validation cost about ten times the rest of the calibration, seconds with 4 loopback ranks
/// on 2 cores; the budget below skips the 4 MiB probe where the 1 MiB one was already slow. The
/// last probe's band reaches to the largest size, or where the budget skipped probes, to the
/// middle between the last one taken and the first one skipped.)
inline constexpr std::size_t kProbeBytes[] = {4096, 16384, 65536, 262144, 1u << 20, 4u << 20};
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

inline bool CalibrationProbe::beaten(AllreduceAlgorithm algo, double factor) const {
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

inline bool CalibrationProbe::mispriced(AllreduceAlgorithm algo, double factor) const {
  const auto it = std::find(algos.begin(), algos.end(), algo);
  if (it == algos.end()) return false;
  const auto k = static_cast<std::size_t>(it - algos.begin());
  return k < measured.size() && k < predicted.size() && beaten(algo, kSwitchFactor) &&
         measured[k] > factor * predicted[k];
}

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

/// The smallest of `v`, 0 when empty. Local, pure.
inline double fastest_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

/// Median of `v` (the mean of the two middle values for an even count; 0 when empty).
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

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

/// The copies that find where a node's cache ends (a node's first rank, kCopyRounds rounds):
/// source and destination of kCopyFirstBytes each (their working set stays in any last-level
/// cache), then of twice, four and eight times that, prefixes of two buffers of kCopyMaxBytes.
/// Each time per byte is the median over the rounds. The sizes are measured rather than read from
/// the machine: where sysfs has no cache entries (a VM here), sysconf reported a 508 MiB level-3
/// cache that the copies place at 32-48 MiB, and buffers sized by that report cost a node's first
/// rank 256 MiB of peak memory for the calibration alone (benchmarks/RESULTS.md). At most
/// 2 * kCopyMaxBytes: caches beyond a 64 MiB working set show no knee here, and the model then
/// keeps the cache's per-byte terms at every size.
inline constexpr std::size_t kCopyFirstBytes = 4u << 20;
inline constexpr std::size_t kCopyMaxBytes = 32u << 20;
inline constexpr int kCopyRounds = 3;
/// Slower than the smallest copy by less than this, the largest copy shows no memory-bound
/// regime (the working sets tried all fit a cache, or the machine's memory keeps up).
inline constexpr double kKneeMinFactor = 1.3;

/// Where copies leave the cache: from the per-byte times of copies of ascending working sets
/// `ws` (source and destination bytes), the smallest working set whose copy ran at least halfway
/// in ratio from the first one's per-byte time to the last one's (their geometric mean: the
/// model's switch from the one to the other is then off by at most the square root of
/// mem_factor at the sizes tried), as CostModel::cache_bytes; 0 (the model never switches) when
/// the last ran less than kKneeMinFactor times slower than the first, or the times are unusable.
/// Pure.
inline double cache_knee(const std::vector<double>& ws, const std::vector<double>& per_byte) {
  if (ws.size() < 2 || ws.size() != per_byte.size()) return 0;
  const double first = per_byte.front(), last = per_byte.back();
  if (!(first > 0) || !(last >= kKneeMinFactor * first)) return 0;
  const double half = std::sqrt(first * last);
  for (std::size_t i = 1; i < ws.size(); ++i)
    if (per_byte[i] >= half) return ws[i];
  return ws.back();
}

template <class Transport>
class Calibrator {
  using Plan = PlanImpl<Transport>;

 public:
  Calibrator(CommState<Transport>& st, ModelView view)
      : st_(st), view_(std::move(view)), t_(*st.transport), r_(t_.rank()), p_(t_.size()) {}

  /// Measures, agrees, fits and validates (collective).
  Calibration run() {
    const double t0 = now_seconds();
    st_.engine.drain();
    {  // The calibration is a collective of its own, so its fingerprint keeps ranks in step.
      Plan cal(st_, spec(CollectiveKind::calibrate));
      execute_in_order(st_, cal);
    }
    Calibration c;
    c.model = measure_model();
    c.decisions = model_decisions(c.model, view_);
    if (p_ > 1) validate(c);
    c.seconds = now_seconds() - t0;
    return c;
  }

 private:
  static constexpr const char* kDuring = "the cost-model calibration";
  static PlanSpec spec(CollectiveKind k) {
    PlanSpec s;
    s.kind = k;
    s.during = k == CollectiveKind::calibrate ? nullptr : kDuring;  // "calibrate #N" says it
    return s;
  }
  static PlanSpec allreduce_spec(AllreduceAlgorithm a, DType t, const void* in, void* out,
                                 std::size_t count, ReduceOp op = ReduceOp::sum) {
    PlanSpec s = spec(CollectiveKind::allreduce);
    s.algo = a;
    s.dtype = t;
    s.in = in;
    s.out = out;
    s.count = count;
    s.op = op;
    return s;
  }
  double sample(CalibrationQuantity q, int round, double seconds,
                AllreduceAlgorithm algo = AllreduceAlgorithm::ring, std::size_t bytes = 0) const {
    const auto& hook = calibration_hook();
    if (!hook) return seconds;
    CalibrationSample s;
    s.rank = r_;
    s.quantity = q;
    s.round = round;
    s.algo = algo;
    s.bytes = bytes;
    s.seconds = seconds;
    return hook(s);
  }
  // In-place all-reduce (max) of `n` doubles by recursive doubling: the agreement step.
  void agree_max(double* v, std::size_t n) {
    Plan agree(st_, allreduce_spec(AllreduceAlgorithm::rd, DType::f64, v, v, n, ReduceOp::max));
    execute_in_order(st_, agree);
  }
  void wait(typename Transport::Request& q, const Deadline& deadline, int partner) {
    if (!t_.wait_until(q, deadline))
      raise<TimeoutError>(
          "cost-model calibration",
          concat("wait for rank ", partner, " timed out after ", deadline.budget(), " s"));
  }

  /// An shm all-reduce of `count` f32 in place on `data` among the ranks of this rank's node,
  /// on the node's segments `seg`, outside any plan (the calibration's measurement of what hier
  /// and hier_leader pay inside a node).
  struct NodeShm {
    std::unique_ptr<PlanContext<Transport>> root, view;
    std::unique_ptr<ShmAlgorithm<Transport>> algo;
    void run(CommState<Transport>& st) {
      root->begin(st.seq.load());
      algo->run();
    }
  };
  NodeShm node_shm(const NodeMap& nodes, SharedSegments* seg, float* data, std::size_t count) {
    NodeShm n;
    n.root = std::make_unique<PlanContext<Transport>>(
        st_, allreduce_spec(AllreduceAlgorithm::shm, DType::f32, data, data, count));
    n.view =
        std::make_unique<PlanContext<Transport>>(*n.root, nodes.members(nodes.node_of(r_)), count,
                                                 ReduceOp::sum, kFirstAlgorithmChannel, 0, seg);
    n.algo = std::make_unique<ShmAlgorithm<Transport>>(*n.view, data, data);
    return n;
  }

  CostModel measure_model() {
    constexpr int kTag = 32767;           // above every plan channel's tag (detail::channel_tag)
    constexpr std::size_t big = 4 << 20;  // beyond the caches: the bandwidth-bound regime
    const int partner = r_ ^ 1;
    const bool paired = partner < p_;
    const Deadline deadline(st_.config.timeout_s);
    typename Transport::Request a, b;
    std::uint64_t words[2] = {0, 0};
    ScopedRegistration<Transport> word_reg(t_, words, sizeof(words));
    auto* word = static_cast<std::uint64_t*>(word_reg.region().data);
    std::vector<unsigned char> sbuf(big, 1), rbuf(big);
    ScopedRegistration<Transport> sreg(t_, sbuf.data(), big), rreg(t_, rbuf.data(), big);
    std::vector<float> x(big / sizeof(float), 1.0f), y(big / sizeof(float), 2.0f);

    auto ping_pong = [&](int peer) {
      if (r_ < peer) {
        t_.isend(a, peer, kTag, word, 8);
        wait(a, deadline, peer);
        t_.irecv(b, peer, kTag, word + 1, 8);
        wait(b, deadline, peer);
      } else {
        t_.irecv(b, peer, kTag, word + 1, 8);
        wait(b, deadline, peer);
        t_.isend(a, peer, kTag, word, 8);
        wait(a, deadline, peer);
      }
    };
    auto exchange = [&](int peer) {
      t_.irecv(b, peer, kTag, rreg.region().data, big);
      t_.isend(a, peer, kTag, sreg.region().data, big);
      wait(b, deadline, peer);
      wait(a, deadline, peer);
    };
    // Half a ping-pong (minimum of a burst) and one exchange with `peer`, as samples qa, qb.
    auto pair_round = [&](int peer, int round, CalibrationQuantity qa, CalibrationQuantity qb,
                          std::vector<double>& sa, std::vector<double>& sb) {
      double best = 1e30;
      for (int i = 0; i < 12; ++i) {
        const double t0 = now_seconds();
        ping_pong(peer);
        best = std::min(best, now_seconds() - t0);
      }
      sa.push_back(sample(qa, round, best / 2));
      const double t0 = now_seconds();
      exchange(peer);
      sb.push_back(sample(qb, round, now_seconds() - t0));
    };
    // Between nodes: the first rank of node 2k with the first rank of node 2k+1.
    const NodeMap nodes = node_map_of(t_);
    const bool multi = nodes.nodes() > 1;
    int inter = -1;
    if (multi && nodes.local_rank(r_) == 0 && (nodes.node_of(r_) ^ 1) < nodes.nodes())
      inter = nodes.members(nodes.node_of(r_) ^ 1).front();
    // ... and every rank with the rank of the same local number there, all pairs at once, where
    // nodes have several ranks: how far the node's links (or cores) are shared (inter_share).
    int cross = -1;
    if (multi && nodes.shape().max_ranks_per_node > 1 && (nodes.node_of(r_) ^ 1) < nodes.nodes()) {
      const std::vector<int>& there = nodes.members(nodes.node_of(r_) ^ 1);
      const auto l = static_cast<std::size_t>(nodes.local_rank(r_));
      if (l < there.size()) cross = there[l];
    }

    // The fixed cost of a call: a one-element rd all-reduce, whose steps the model prices.
    float one[1] = {1.0f};
    std::unique_ptr<Plan> call_plan;
    {
      call_plan = std::make_unique<Plan>(
          st_, allreduce_spec(AllreduceAlgorithm::rd, DType::f32, one, one, 1));
    }
    // Cache against memory: a node's first rank copies working sets from 8 to 64 MiB (see
    // kCopyFirstBytes), skipped where the probes are limited below 4 MiB (tests). The two
    // buffers are the calibration's largest allocation, made while the model and optimizer state
    // already exist: a rank's peak memory grows by 2 * kCopyMaxBytes at most.
    const bool copier = nodes.local_rank(r_) == 0 && calibration_probe_limit() >= big;
    const std::size_t mem_bytes = copier ? kCopyMaxBytes : 0;
    std::vector<unsigned char> mem_src(mem_bytes, 1), mem_dst(mem_bytes, 0);
    std::vector<std::size_t> copy_sizes;  // bytes copied, each a working set of twice that
    for (std::size_t b = kCopyFirstBytes; copier && b <= kCopyMaxBytes; b *= 2)
      copy_sizes.push_back(b);
    std::vector<std::vector<double>> s_copies(copy_sizes.size());

    // The shm all-reduce: over the whole group where it shares segments (one node); with
    // several nodes, among the ranks of each node on the node's segments, which is what hier and
    // hier_leader pay inside a node (a rank alone on its node measures nothing, the agreement
    // takes the other nodes' figures).
    SharedSegments* const seg = shared_segments_of(t_);
    SharedSegments* const node_seg =
        !seg && multi && nodes.node_size(nodes.node_of(r_)) > 1 ? node_segments_of(t_) : nullptr;
    SharedSegments* const shm_seg = seg ? seg : node_seg;
    CalibrationFloats v(calibration_allocator(shm_seg), shm_seg ? big / sizeof(float) : 0, 1.0f);
    float tiny[8] = {};
    std::unique_ptr<Plan> big_plan, tiny_plan;
    NodeShm node_big, node_tiny;
    if (seg) {
      big_plan = std::make_unique<Plan>(
          st_, allreduce_spec(AllreduceAlgorithm::shm, DType::f32, v.data(), v.data(), v.size()));
      tiny_plan = std::make_unique<Plan>(
          st_, allreduce_spec(AllreduceAlgorithm::shm, DType::f32, tiny, tiny, 8));
    } else if (node_seg) {
      node_big = node_shm(nodes, node_seg, v.data(), v.size());
      node_tiny = node_shm(nodes, node_seg, tiny, 8);
    }
    auto run_big = [&] { big_plan ? execute_in_order(st_, *big_plan) : node_big.run(st_); };
    auto run_tiny = [&] { tiny_plan ? execute_in_order(st_, *tiny_plan) : node_tiny.run(st_); };
    // Warm-up, unmeasured: connections, first touch of every buffer and segment.
    if (paired) {
      ping_pong(partner);
      exchange(partner);
    }
    if (inter >= 0) {
      ping_pong(inter);
      exchange(inter);
    }
    if (cross >= 0) exchange(cross);
    host::reduce(ReduceOp::sum, x.data(), x.data(), y.data(), x.size());
    execute_in_order(st_, *call_plan);
    if (shm_seg) {
      run_big();
      run_tiny();
    }

    std::vector<double> s_alpha, s_beta, s_gamma, s_shm_alpha, s_shm_beta, s_inter_alpha,
        s_inter_beta, s_inter_shared, s_call;
    for (int round = 0; round < kRounds; ++round) {
      if (paired)
        pair_round(partner, round, CalibrationQuantity::alpha, CalibrationQuantity::beta, s_alpha,
                   s_beta);
      {
        const double t0 = now_seconds();
        host::reduce(ReduceOp::sum, x.data(), x.data(), y.data(), x.size());
        s_gamma.push_back(sample(CalibrationQuantity::gamma, round, now_seconds() - t0));
      }
      {
        double best = 1e30;
        for (int i = 0; i < 12; ++i) {
          const double t0 = now_seconds();
          execute_in_order(st_, *call_plan);
          best = std::min(best, now_seconds() - t0);
        }
        s_call.push_back(
            sample(CalibrationQuantity::call, round, best, AllreduceAlgorithm::rd, sizeof(one)));
      }
      // Between nodes, right after the all-reduces above: the nodes' first ranks alone, as
      // hier_leader's leaders run, with no memory of the contention that the all-reduces of
      // all ranks left, while the other ranks of each node wait for theirs in an shm all-reduce
      // on the node's segments, blocked in the kernel as hier_leader's do; then every rank with
      // its counterpart, the pairs starting together after one more all-reduce. (Measured
      // while the others polled in an all-reduce over the transport and with the memory left
      // set, which paces MPI's waits with sleeps: on 2x2 fake nodes a 4 MiB exchange took
      // 3.2-5.6 ms instead of 0.6-1.0; benchmarks/RESULTS.md.)
      if (multi) {
        if (inter >= 0) {
          forget_contention();
          pair_round(inter, round, CalibrationQuantity::inter_alpha,
                     CalibrationQuantity::inter_beta, s_inter_alpha, s_inter_beta);
        }
        if (node_seg) run_tiny();
        execute_in_order(st_, *call_plan);
        if (cross >= 0) {
          const double t0 = now_seconds();
          exchange(cross);
          s_inter_shared.push_back(
              sample(CalibrationQuantity::inter_shared, round, now_seconds() - t0));
        }
      }
      if (copier && round < kCopyRounds) {
        for (std::size_t i = 0; i < copy_sizes.size(); ++i) {
          // The same copy three times, the faster of the last two timed: what fits the cache is
          // then in it.
          const std::size_t b = copy_sizes[i];
          std::memcpy(mem_dst.data(), mem_src.data(), b);
          double best = 1e30;
          for (int rep = 0; rep < 2; ++rep) {
            const double t0 = now_seconds();
            std::memcpy(mem_dst.data(), mem_src.data(), b);
            best = std::min(best, now_seconds() - t0);
          }
          const double per_byte = best / double(b);
          const CalibrationQuantity q =
              i == 0 ? CalibrationQuantity::copy_cache : CalibrationQuantity::copy_memory;
          s_copies[i].push_back(sample(q, round, per_byte, AllreduceAlgorithm::ring, 2 * b));
        }
      }
      if (shm_seg) {
        double best = 1e30;
        for (int i = 0; i < 12; ++i) {
          const double t0 = now_seconds();
          run_tiny();
          best = std::min(best, now_seconds() - t0);
        }
        s_shm_alpha.push_back(sample(CalibrationQuantity::shm_alpha, round, best,
                                     AllreduceAlgorithm::shm, sizeof(tiny)));
        std::fill(v.begin(), v.end(), 1.0f);
        const double t0 = now_seconds();
        run_big();
        s_shm_beta.push_back(sample(CalibrationQuantity::shm_beta, round, now_seconds() - t0,
                                    AllreduceAlgorithm::shm, big));
      }
      // A pause between rounds spreads them in time, so one burst of load hits few of them.
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // Each copy's median per byte, and where this node's copies left the cache, as a working
    // set (a node's first rank; none elsewhere).
    std::vector<double> copy_ws, copy_per_byte;
    for (std::size_t i = 0; i < copy_sizes.size(); ++i) {
      copy_ws.push_back(2.0 * static_cast<double>(copy_sizes[i]));
      copy_per_byte.push_back(median_of(s_copies[i]));
    }
    const double knee = cache_knee(copy_ws, copy_per_byte);
    // Raw medians, agreed (maximum over ranks), then the fit: every rank fits the same numbers.
    // The leaders' exchange between nodes takes its fastest round instead: with the other ranks
    // of the nodes blocked it is a single pair's transfer, which a disturbance (another rank
    // scheduled onto its cores) only slows. On 2x2 fake nodes its median of 5 rounds came out at
    // either 0.18-0.32 or 0.80-1.01 ns/B between runs, and the model's choice between hier and
    // hier_leader from 64 KiB up followed it; the fastest round gave 0.12-0.23 in 14 of 15
    // runs, where the bench times hier_leader faster (benchmarks/RESULTS.md).
    double m[14] = {median_of(s_alpha),
                    median_of(s_beta),
                    median_of(s_gamma),
                    median_of(s_shm_alpha),
                    median_of(s_shm_beta),
                    median_of(s_inter_alpha),
                    fastest_of(s_inter_beta),
                    median_of(s_call),
                    copier ? copy_per_byte.front() : 0.0,
                    copier ? copy_per_byte.back() : 0.0,
                    static_cast<double>(nodes.max_machine_ranks()),
                    knee,
                    static_cast<double>(shm_seg ? shm_seg->slot_bytes : 0),
                    median_of(s_inter_shared)};
    agree_max(m, 14);
    CostModel cm;
    const double alpha = m[0];
    cm.alpha = std::max(alpha, 1e-9);
    cm.beta = std::max((m[1] - alpha) / double(big), 1e-13);  // agreed: the paired ranks
    cm.gamma = std::max(m[2] / double(big), 0.0);
    if (multi) {  // measured between the nodes' first ranks
      cm.inter_alpha = std::max(m[5], 1e-9);
      cm.inter_beta = std::max((m[6] - m[5]) / double(big), 1e-13);
      if (m[13] > 0 && m[6] > m[5]) cm.inter_share = std::max((m[13] - m[5]) / (m[6] - m[5]), 1.0);
    }
    // The fixed cost of a call: the one-element rd all-reduce less its modelled steps.
    cm.call = std::max(m[7] - cm.steps(AllreduceAlgorithm::rd, sizeof(one), p_), 0.0);
    if (m[12] > 0) {  // agreed: some rank measured shm (every rank of one node, or of a node)
      const double tiny_t = m[3], big_t = m[4];
      // A one-chunk shm all-reduce costs three counter hand-offs after the fixed cost (of a
      // plan's call, which the node measurement, outside a plan, does not pay; the floor below
      // keeps it from vanishing).
      cm.shm_alpha = std::max(std::max(tiny_t - cm.call, 0.25 * tiny_t) / 3, 1e-9);
      // Per byte: the big run without the fixed cost and its chunks' counter hand-offs.
      cm.shm_chunk = static_cast<double>(shm_chunk_bytes(static_cast<std::size_t>(m[12])));
      const double chunks = std::ceil(double(big) / cm.shm_chunk);
      cm.shm_beta = std::max(
          std::max(big_t - cm.call - 3 * chunks * cm.shm_alpha, 0.5 * big_t) / double(big), 1e-13);
    }
    if (m[8] > 0 && m[9] > 0 && m[11] > 0) {
      cm.cache_bytes = m[11];
      cm.cache_ranks = static_cast<int>(m[10]);
      cm.mem_factor = std::max(m[9] / m[8], 1.0);
    }
    return cm;
  }

  void validate(Calibration& c) {
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
    st_.cost = c.model;
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
    std::vector<double> med, slow, fast;  // every probe's algorithms in order: median, extremes
    std::vector<double> all;              // ... and each of their repetitions
    // The previous probe: its wall time per call of a burst and each algorithm's median, agreed
    // (slowest rank), so every rank takes the same decisions below.
    double spent = 0;
    std::size_t spent_bytes = 0;
    std::vector<AllreduceAlgorithm> prev_algos;
    std::vector<double> prev_med;
    for (std::size_t bytes : kProbeBytes) {
      if (bytes > max_bytes) break;
      const AllreduceAlgorithm pick = lookup_decision(c.decisions, bytes);
      // The burst length follows the model's pick, its fastest prediction (every rank alike).
      const int burst = probe_burst_calls(view_.predict(c.model, pick, bytes));
      CalibrationProbe q;
      q.bytes = bytes;
      q.pick = pick;
      q.burst = burst;
      q.runner_up = view_.best(c.model, bytes, q.pick);
      q.algos.push_back(q.pick);
      for (AllreduceAlgorithm a : view_.candidates)
        if (a != q.pick && view_.predict(c.model, a, bytes) < 1e299) q.algos.push_back(a);
      // A slow transport (MPI-RMA through a software progress path, more ranks than cores)
      // would spend minutes on the larger probes: a probe whose cost, extrapolated from the
      // previous one linearly in size and in calls per burst, and by the share of its time the
      // algorithms taken spent there (probe_share), exceeds the budget
      // runs narrowed (kNarrowFactor) where that fits, else is skipped with every larger one.
      // The model's table then stands unvalidated from the middle between the last probe taken
      // and this one (validated_to).
      const auto cost = [&](const std::vector<AllreduceAlgorithm>& algos) {
        return spent * probe_share(algos, prev_algos, prev_med) * burst *
               static_cast<double>(bytes) / static_cast<double>(spent_bytes);
      };
      if (spent_bytes && cost(q.algos) > calibration_probe_budget()) {
        std::vector<AllreduceAlgorithm> close =
            narrowed_probe(q.algos, q.pick, prev_algos, prev_med);
        if (close.size() < 2 || cost(close) > calibration_probe_budget()) {
          c.validated_to = std::sqrt(static_cast<double>(spent_bytes) * static_cast<double>(bytes));
          break;
        }
        q.algos = std::move(close);
        q.narrowed = true;
      }
      const std::size_t n = q.algos.size();
      std::vector<std::unique_ptr<Plan>> plans;
      for (AllreduceAlgorithm a : q.algos) {
        q.predicted.push_back(view_.predict(c.model, a, bytes));
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
        slow.push_back(*std::max_element(t.begin(), t.end()));
        fast.push_back(fastest_of(t));
        all.insert(all.end(), t.begin(), t.end());
      }
      prev_algos = q.algos;
      prev_med.assign(med.end() - static_cast<std::ptrdiff_t>(n), med.end());
      prev_med.push_back((now_seconds() - probe_start) / burst);
      agree_max(prev_med.data(), prev_med.size());
      spent = prev_med.back();
      prev_med.pop_back();
      spent_bytes = bytes;
      c.probes.push_back(std::move(q));
    }
    const std::size_t n_med = med.size();
    med.insert(med.end(), slow.begin(), slow.end());
    med.insert(med.end(), fast.begin(), fast.end());
    med.insert(med.end(), all.begin(), all.end());
    agree_max(med.data(), med.size());
    std::size_t at = 0;
    for (CalibrationProbe& q : c.probes) {
      q.measured.assign(med.begin() + at, med.begin() + at + q.algos.size());
      q.slowest.assign(med.begin() + n_med + at, med.begin() + n_med + at + q.algos.size());
      q.fastest.assign(med.begin() + 2 * n_med + at, med.begin() + 2 * n_med + at + q.algos.size());
      const auto r0 = 3 * n_med + at * static_cast<std::size_t>(kProbeReps);
      q.reps.assign(med.begin() + r0, med.begin() + r0 + q.algos.size() * kProbeReps);
      at += q.algos.size();
      std::size_t w = 0;
      for (std::size_t k = 1; k < q.measured.size(); ++k)
        if (q.measured[k] < q.measured[w]) w = k;
      q.winner = q.algos[w];
      q.replaced = q.beaten(q.pick, kSwitchFactor);
    }
    // Also without a replaced pick: a size between probes may have another model pick than the
    // probe's own, beaten there.
    if (!c.probes.empty()) c.decisions = apply_probes(c.model, view_, c.probes, c.validated_to);
  }

  CommState<Transport>& st_;
  ModelView view_;
  Transport& t_;
  int r_, p_;
};

/// Measures the model and its validated decision table over `st`'s transport (collective: every
/// rank calls it at the same point of its collective sequence; queued collectives are drained
/// first). Every rank returns the same model and table.
/// `view` says how the model is applied (flat_model_view(p) for p ranks on one node,
/// topology_model_view with the transport's node grouping otherwise).
template <class Transport>
Calibration calibrate(CommState<Transport>& st, ModelView view) {
  Calibration c = Calibrator<Transport>(st, std::move(view)).run();
  last_calibration() = c;
  return c;
}

/// The model alone (the collective calibration, decision table discarded).
template <class Transport>
CostModel measure_cost_model(CommState<Transport>& st) {
  Transport& t = *st.transport;
  return calibrate(st, topology_model_view(t.size(), node_map_of(t).shape())).model;
}

}  // namespace dtrain::detail
