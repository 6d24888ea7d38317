// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the calibration's instruments, shared by its two measurements (measure.hpp: the cost
// model's terms; probes.hpp: the algorithms timed at a few sizes).
//
// - Every raw timing passes through sample(), where a test hook may replace it (tests inject
//   slow samples, or make every timing synthetic so decisions are exactly predictable).
// - agree_max(): every rank's figures are combined by a max all-reduce (the slowest rank's), so
//   every rank fits the same model and takes the same decisions, bit for bit.
// - The buffers the transport moves are registered with it first, as a plan registers its own,
//   so a transport that requires registration is measured as it is used; shm is measured on the
//   node-shared heap where there is one, as a model built on Communicator::shared_allocator()
//   uses it.
// - median_of / fastest_of: the statistics over rounds and repetitions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

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

/// Test knob: probes larger than this are skipped, and so are the cache copies where it is below
/// 4 MiB (tests keep calibrations short with it; set it before any rank calibrates).
inline std::size_t& calibration_probe_limit() {
  static std::size_t limit = ~std::size_t{0};
  return limit;
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

/// Floats for the calibration's shm measurements and probes, from `alloc` (filled with `value`).
/// The calibration takes them from the transport's node-shared heap where there is one: a model
/// built on Communicator::shared_allocator() keeps its gradients there, which the shm all-reduce
/// (and hier, hier_leader inside a node) reads in place (about half the passes over the data of
/// buffers elsewhere), so that is the shm to price. Without a heap, or where it is full, they
/// are host memory.
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

/// What every step of one calibration shares (the base of measure.hpp's and probes.hpp's
/// steps): the communicator's state and transport, the hooked sample, the agreement, the specs
/// of the calibration's own plans, and its waits. One per calibration and rank.
template <class Transport>
class CalibrationStep {
 protected:
  using Plan = PlanImpl<Transport>;

  explicit CalibrationStep(CommState<Transport>& st)
      : st_(st), t_(*st.transport), r_(t_.rank()), p_(t_.size()) {}

  /// The spec of one of the calibration's own collectives: its errors say they happened during
  /// the calibration (the `calibrate` kind, its opening check, names itself).
  static PlanSpec spec(CollectiveKind k) {
    PlanSpec s;
    s.kind = k;
    s.during = k == CollectiveKind::calibrate ? nullptr : "the cost-model calibration";
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

  /// A raw timing of this rank, through the test hook where one is set.
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

  /// In-place all-reduce (max) of `n` doubles by recursive doubling: the agreement step.
  /// Collective.
  void agree_max(double* v, std::size_t n) {
    Plan agree(st_, allreduce_spec(AllreduceAlgorithm::rd, DType::f64, v, v, n, ReduceOp::max));
    execute_in_order(st_, agree);
  }

  /// Waits for a point-to-point request of the model's measurements.
  void wait(typename Transport::Request& q, const Deadline& deadline, int partner) {
    if (!t_.wait_until(q, deadline))
      raise<TimeoutError>(
          "cost-model calibration",
          concat("wait for rank ", partner, " timed out after ", deadline.budget(), " s"));
  }

  CommState<Transport>& st_;
  Transport& t_;
  int r_, p_;
};

}  // namespace dtrain::detail
