// SPDX-License-Identifier: BSD-3-Clause
// dtrain: Communicator, the collectives (all-reduce, reduce-scatter, all-gather, broadcast,
// barrier) over any transport that satisfies is_transport_v.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/collective_handle.hpp>
#include <dtrain/comm/collective_plan.hpp>
#include <dtrain/comm/comm_config.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/calibration.hpp>
#include <dtrain/comm/detail/tuning.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain {

/// Elements [begin, end) that rank `i` of `parts` owns when `count` elements are split as evenly
/// as possible (the first count % parts ranks get one more). reduce_scatter and allgather use
/// this split. Local, pure.
inline std::size_t partition_begin(std::size_t count, int parts, int i) noexcept {
  return detail::block_begin(count, static_cast<std::size_t>(parts), static_cast<std::size_t>(i));
}
/// Number of elements rank `i` owns in that split. Local, pure.
inline std::size_t partition_count(std::size_t count, int parts, int i) noexcept {
  return partition_begin(count, parts, i + 1) - partition_begin(count, parts, i);
}

/// The group of ranks a transport connects, with collectives on it.
///
/// Every method named "collective" must be called by all ranks in the same order with matching
/// arguments; each call carries a fingerprint (sequence number, operation, dtype, count), and a
/// mismatch raises RemoteError on every rank naming each call and the ranks that made it. Every
/// wait has a deadline (CommConfig::timeout_s, default 300 s); on expiry TimeoutError names the
/// rank, the collective, its sequence number and the peer. After a failure the communicator refuses
/// further collectives (RemoteError). Buffers are owned by the caller and lie in host memory;
/// broadcast also accepts device memory when the transport's capabilities say it moves device
/// memory (supports_device_memory), and every call refuses device memory otherwise.
/// Thread-safety: one user thread at a time per communicator; the communicator's own progress
/// thread is internal (see detail/progress_engine.hpp for how progress is made and its cost).
template <class Transport>
class Communicator {
  static_assert(detail::check_transport<Transport>(), "Communicator needs a dtrain transport");

 public:
  using transport_type = Transport;
  using Plan = CollectivePlan<Transport>;

  /// Local: wraps `transport` (which must outlive the communicator) with the configuration of
  /// the environment: reads the DTRAIN_COMM_* / DTRAIN_ALLREDUCE_ALGO variables once, here
  /// (CommConfig::from_env; InvalidArgument naming the variable on a malformed value).
  explicit Communicator(Transport& transport) : Communicator(transport, CommConfig::from_env()) {}
  /// Local: wraps `transport` with exactly `config` (reads no environment).
  Communicator(Transport& transport, CommConfig config)
      : state_(std::make_unique<detail::CommState<Transport>>(transport, config)),
        topology_(node_map_of(transport).shape()) {
    DTRAIN_REQUIRE(config.timeout_s > 0, "Communicator", "timeout " << config.timeout_s << " s");
    detail::RunGapWatch::start();  // once per process: lets a late rank's timeout say so
    if (config.cost_model.valid()) adopt_model(config.cost_model);
  }
  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) = delete;
  ~Communicator() = default;

  int rank() const noexcept { return state_->transport->rank(); }
  int size() const noexcept { return state_->transport->size(); }
  Transport& transport() noexcept { return *state_->transport; }
  const CommConfig& config() const noexcept { return state_->config; }
  /// Local: changes the deadline of later waits (every rank should use the same).
  void set_timeout(double seconds) {
    DTRAIN_REQUIRE(seconds > 0, "Communicator::set_timeout", "timeout " << seconds << " s");
    state_->config.timeout_s = seconds;
    state_->engine.set_timeout(seconds);
  }
  /// Number of collectives this rank has run so far (the next fingerprint's sequence number).
  std::uint64_t sequence() const noexcept { return state_->seq.load(); }
  /// Whether non-blocking collectives progress on a thread of their own.
  bool has_progress_thread() const noexcept { return state_->engine.threaded(); }
  /// Local: bytes of the scratch block this communicator's plans share (they run one at a time,
  /// so e.g. every bucket plan of a GradientSync works in the same block); 0 before the first
  /// plan that needs scratch, and on transports that register memory, whose plans each keep
  /// their own. Blocks made so far: scratch_blocks().
  std::size_t scratch_bytes() const { return state_->scratch_pool.bytes(); }
  std::size_t scratch_blocks() const { return state_->scratch_pool.blocks_made(); }

  // ---- blocking collectives ----------------------------------------------------------------

  /// Collective, blocking: returns once every rank has entered.
  void barrier() { run_adhoc(make_spec(detail::CollectiveKind::barrier)); }

  /// Collective, blocking: copies `buf` of rank `root` into `buf` on every rank.
  void broadcast(BufferView buf, int root) { run_adhoc(broadcast_spec(buf, root)); }

  /// Collective, blocking: `in_out` becomes the element-wise reduction over all ranks.
  void allreduce(BufferView in_out, ReduceOp op,
                 AllreduceAlgorithm algo = AllreduceAlgorithm::automatic) {
    allreduce(in_out, in_out, op, algo);
  }
  /// Collective, blocking: `out` = reduction of every rank's `in` (same count and dtype; `in`
  /// is not modified; the views must be identical or disjoint).
  void allreduce(BufferView in, BufferView out, ReduceOp op,
                 AllreduceAlgorithm algo = AllreduceAlgorithm::automatic) {
    run_adhoc(allreduce_spec(in, out, op, algo));
  }
  /// Collective, blocking: `in` holds the full vector (same count on every rank); `out` gets
  /// this rank's part of the reduction, partition_count(in.count, size(), rank()) elements.
  /// `out` may be this rank's part of `in` itself (in place), else it must not overlap `in`.
  void reduce_scatter(BufferView in, BufferView out, ReduceOp op) {
    run_adhoc(reduce_scatter_spec(in, out, op));
  }
  /// Collective, blocking: `out` (the full vector, same count on every rank) gets every rank's
  /// `in`, which holds partition_count(out.count, size(), rank()) elements, at that rank's
  /// partition_begin.
  void allgather(BufferView in, BufferView out) { run_adhoc(allgather_spec(in, out)); }

  // ---- non-blocking collectives ------------------------------------------------------------
  // Each returns at once; the buffers belong to the collective until the handle completes.

  CollectiveHandle ibarrier() { return start_adhoc(make_spec(detail::CollectiveKind::barrier)); }
  CollectiveHandle ibroadcast(BufferView buf, int root) {
    return start_adhoc(broadcast_spec(buf, root));
  }
  CollectiveHandle iallreduce(BufferView in_out, ReduceOp op,
                              AllreduceAlgorithm algo = AllreduceAlgorithm::automatic) {
    return iallreduce(in_out, in_out, op, algo);
  }
  CollectiveHandle iallreduce(BufferView in, BufferView out, ReduceOp op,
                              AllreduceAlgorithm algo = AllreduceAlgorithm::automatic) {
    return start_adhoc(allreduce_spec(in, out, op, algo));
  }
  CollectiveHandle ireduce_scatter(BufferView in, BufferView out, ReduceOp op) {
    return start_adhoc(reduce_scatter_spec(in, out, op));
  }
  CollectiveHandle iallgather(BufferView in, BufferView out) {
    return start_adhoc(allgather_spec(in, out));
  }

  // ---- plans -------------------------------------------------------------------------------
  // Local (collective only when `automatic` needs the cost model measured for the first time):
  // set everything up once; execute()/start() then allocate nothing.

  // With CommConfig::adaptive an `automatic` plan also checks its choice while in use (README
  // "Which all-reduce runs"): every rank must then execute it the same number of times, as the
  // collective contract asks of every plan. Ad-hoc calls never change algorithm: which of them
  // reuse a cached plan depends on each rank's buffer addresses.
  Plan plan_allreduce(BufferView in, BufferView out, ReduceOp op,
                      AllreduceAlgorithm algo = AllreduceAlgorithm::automatic) {
    return plan_allreduce(in, out, op, algo, true);
  }
  /// As above, for one plan of a group that every rank always executes together and in the same
  /// order (a GradientSync's buckets in one step). With `check_fingerprints` false the plan skips
  /// the call-fingerprint exchange (a latency round before each execution); the group's first
  /// plan keeps it, so a rank out of step or with other sizes is still caught once per group.
  Plan plan_allreduce(BufferView in, BufferView out, ReduceOp op, AllreduceAlgorithm algo,
                      bool check_fingerprints) {
    Spec s = allreduce_spec(in, out, op, algo);
    s.check = check_fingerprints;
    if (algo == AllreduceAlgorithm::automatic && adapts())
      s.runner_up = runner_up(s.algo, in.count, in.dtype);
    return Plan(make_plan(s));
  }
  Plan plan_broadcast(BufferView buf, int root) {
    return Plan(make_plan(broadcast_spec(buf, root)));
  }
  /// With `check_fingerprints` false, as plan_allreduce's group form: for a plan that every
  /// rank executes together with a checked one, in the same order.
  Plan plan_reduce_scatter(BufferView in, BufferView out, ReduceOp op,
                           bool check_fingerprints = true) {
    Spec s = reduce_scatter_spec(in, out, op);
    s.check = check_fingerprints;
    return Plan(make_plan(s));
  }
  Plan plan_allgather(BufferView in, BufferView out, bool check_fingerprints = true) {
    Spec s = allgather_spec(in, out);
    s.check = check_fingerprints;
    return Plan(make_plan(s));
  }

  // ---- algorithm choice ----------------------------------------------------------------------

  /// The algorithm `automatic` resolves to for `count` elements of `dtype`: in reproducible mode
  /// the ordered counterpart of the DTRAIN_ALLREDUCE_ALGO / CommConfig choice (never measures);
  /// else that choice if set, else the row of allreduce_decisions() for its size.
  /// Collective the first time the cost model has to be measured.
  AllreduceAlgorithm select_allreduce(std::size_t count, DType dtype) {
    if (state_->config.reproducible)
      return reproducible_counterpart(state_->config.default_algorithm, has_shared_segments());
    if (state_->config.default_algorithm != AllreduceAlgorithm::automatic)
      return state_->config.default_algorithm;
    if (size() == 1) return AllreduceAlgorithm::ring;
    // 16-bit floats travel as f32.
    const std::size_t es = (dtype == DType::f16 || dtype == DType::bf16) ? 4 : size_of(dtype);
    cost_model();
    return lookup_decision(state_->decisions, count * es);
  }
  /// Local: the shape of the transport's node grouping (<dtrain/comm/topology.hpp>) that
  /// `automatic` and the cost model see.
  const Topology& topology() const noexcept { return topology_; }

  /// Local. Host memory that the other ranks of the node read in place: this rank's part of the
  /// transport's node-shared heap (SharedSegmentConfig::heap_bytes, DTRAIN_SHM_HEAP_MIB) where
  /// the heap is configured and this rank shares its node with others (all ranks on one node,
  /// or the node's ranks under several nodes), else the default host allocator. Build the model
  /// on it (`Sequential model(layers, comm.shared_allocator())`) and the shm all-reduce, and
  /// hier and hier_leader inside each node, average its gradient buckets without copying them
  /// through the segment slots (each rank decides per chunk; ranks whose buffers lie elsewhere
  /// still copy, so mixing is correct). Blocks that do not fit come from the host. The transport
  /// owns the memory: free every block (destroy the model) before the transport.
  Allocator& shared_allocator() const noexcept {
    // The node's segments: the world's where all ranks share one node (node_segments_of).
    SharedSegments* w = node_segments_of(*state_->transport);
    if (w && w->heap_allocator) return *w->heap_allocator;
    return default_allocator();
  }

  /// What `automatic` all-reduce runs per message size (bytes per rank, 16-bit floats counted
  /// as f32): rows of (min_bytes, algorithm), ascending, the first at 0. The same on every rank
  /// and, with a tuning file (DTRAIN_TUNING_FILE), on every run; a trainer can record it. A
  /// pinned algorithm (DTRAIN_ALLREDUCE_ALGO / CommConfig) gives one row. Collective the first
  /// time the cost model has to be measured.
  AllreduceDecisions allreduce_decisions() {
    if (state_->config.default_algorithm != AllreduceAlgorithm::automatic)
      return {AllreduceDecision{0, state_->config.default_algorithm}};
    if (size() == 1) return {AllreduceDecision{0, AllreduceAlgorithm::ring}};
    cost_model();
    return state_->decisions;
  }

  /// The alpha-beta-gamma model. Collective the first time when no model was given: read from
  /// the tuning file when one is configured and matches this job, else measured in interleaved
  /// rounds (median per quantity, the inter-node pair's fastest round; maximum over ranks) and
  /// its decision table validated by timing every algorithm at a few sizes
  /// (detail/calibration.hpp), then written to the tuning file if one is configured. Every rank
  /// ends with the same model and table.
  const CostModel& cost_model() {
    if (!state_->cost.valid()) {
      detail::Calibration c = detail::calibrate_or_load(*state_, model_view());
      state_->cost = c.model;
      state_->decisions = std::move(c.decisions);
      state_->measured.clear();
      for (const detail::CalibrationProbe& q : c.probes) {
        std::vector<std::size_t> k(q.algos.size());
        for (std::size_t i = 0; i < k.size(); ++i) k[i] = i;
        std::stable_sort(k.begin(), k.end(), [&](std::size_t a, std::size_t b) {
          return q.measured[a] < q.measured[b];
        });
        typename detail::CommState<Transport>::MeasuredOrder o;
        o.bytes = q.bytes;
        for (std::size_t i : k) o.fastest_first.push_back(q.algos[i]);
        state_->measured.push_back(std::move(o));
      }
    }
    return state_->cost;
  }
  /// Local: sets the model, and the decision table to the model's own (give every rank the
  /// same one).
  void set_cost_model(const CostModel& m) {
    DTRAIN_REQUIRE(m.valid(), "Communicator::set_cost_model",
                   "alpha and beta must be positive, gamma non-negative");
    adopt_model(m);
  }

 private:
  using Impl = detail::PlanImpl<Transport>;
  using Spec = typename Impl::Spec;

  Spec make_spec(detail::CollectiveKind k) const {
    Spec s;
    s.kind = k;
    return s;
  }

  // Device buffers are accepted only where the transport moves device memory, and only for the
  // collectives that do nothing but move bytes (the reductions and local copies run on the host).
  void require_memory(const BufferView& b, const char* op) const {
    DTRAIN_REQUIRE(b.data != nullptr || b.count == 0, op,
                   "null buffer of " << b.count << " elements");
    if (b.space == Space::host) return;
    DTRAIN_REQUIRE(capabilities_of(*state_->transport).supports_device_memory, op,
                   "buffer in " << name_of(b.space)
                                << " memory, but this transport does not support device memory "
                                   "(transport capability supports_device_memory is false)");
    DTRAIN_REQUIRE(std::string(op) == "broadcast", op,
                   "buffer in " << name_of(b.space)
                                << " memory: only broadcast moves device memory; the reductions "
                                   "and copies of "
                                << op << " run on the host");
  }
  static bool overlap(const BufferView& a, const BufferView& b) {
    const auto* a0 = static_cast<const char*>(a.data);
    const auto* b0 = static_cast<const char*>(b.data);
    return a.bytes() && b.bytes() && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
  }

  Spec broadcast_spec(BufferView buf, int root) const {
    require_memory(buf, "broadcast");
    DTRAIN_REQUIRE(root >= 0 && root < size(), "broadcast",
                   "root " << root << " outside 0.." << size() - 1);
    Spec s = make_spec(detail::CollectiveKind::broadcast);
    s.dtype = buf.dtype;
    s.count = buf.count;
    s.in = buf.data;
    s.out = buf.data;
    s.root = root;
    s.space = buf.space;
    return s;
  }

  Spec allreduce_spec(BufferView in, BufferView out, ReduceOp op, AllreduceAlgorithm algo) {
    require_memory(in, "allreduce");
    require_memory(out, "allreduce");
    DTRAIN_REQUIRE(in.dtype == out.dtype && in.count == out.count, "allreduce",
                   "input is " << in.count << " x " << name_of(in.dtype) << " but output is "
                               << out.count << " x " << name_of(out.dtype));
    DTRAIN_REQUIRE(in.data == out.data || !overlap(in, out), "allreduce",
                   "input and output overlap without being the same buffer");
    Spec s = make_spec(detail::CollectiveKind::allreduce);
    s.op = op;
    s.dtype = in.dtype;
    s.count = in.count;
    s.in = in.data;
    s.out = out.data;
    s.algo = algo == AllreduceAlgorithm::automatic ? select_allreduce(in.count, in.dtype) : algo;
    if (state_->config.reproducible)
      s.algo = reproducible_counterpart(s.algo, has_shared_segments());
    return s;
  }

  // Where this rank's part of the whole vector `v` begins (reduce_scatter's input, allgather's
  // output), the one place either may overlap its other buffer.
  const void* own_part(const BufferView& v) const {
    return static_cast<const char*>(v.data) +
           partition_begin(v.count, size(), rank()) * size_of(v.dtype);
  }

  Spec reduce_scatter_spec(BufferView in, BufferView out, ReduceOp op) const {
    require_memory(in, "reduce_scatter");
    require_memory(out, "reduce_scatter");
    const std::size_t want = partition_count(in.count, size(), rank());
    DTRAIN_REQUIRE(in.dtype == out.dtype && out.count == want, "reduce_scatter",
                   "output must be " << want << " x " << name_of(in.dtype) << " (rank " << rank()
                                     << "'s part of " << in.count << "), got " << out.count << " x "
                                     << name_of(out.dtype));
    DTRAIN_REQUIRE(out.data == own_part(in) || !overlap(in, out), "reduce_scatter",
                   "output overlaps the input other than as this rank's own part");
    Spec s = make_spec(detail::CollectiveKind::reduce_scatter);
    if (state_->config.reproducible) s.algo = AllreduceAlgorithm::ordered;  // rank order too
    s.op = op;
    s.dtype = in.dtype;
    s.count = in.count;
    s.in = in.data;
    s.out = out.data;
    return s;
  }

  Spec allgather_spec(BufferView in, BufferView out) const {
    require_memory(in, "allgather");
    require_memory(out, "allgather");
    const std::size_t want = partition_count(out.count, size(), rank());
    DTRAIN_REQUIRE(in.dtype == out.dtype && in.count == want, "allgather",
                   "input must be " << want << " x " << name_of(out.dtype) << " (rank " << rank()
                                    << "'s part of " << out.count << "), got " << in.count << " x "
                                    << name_of(in.dtype));
    DTRAIN_REQUIRE(in.data == own_part(out) || !overlap(in, out), "allgather",
                   "input overlaps the output other than at this rank's own part");
    Spec s = make_spec(detail::CollectiveKind::allgather);
    s.dtype = out.dtype;
    s.count = out.count;
    s.in = in.data;
    s.out = out.data;
    return s;
  }

  // Whether `automatic` all-reduce plans check their choice while in use (CommConfig::adaptive).
  bool adapts() const noexcept {
    const CommConfig& c = state_->config;
    return c.adaptive && !c.reproducible && c.tuning_file.empty() &&
           c.default_algorithm == AllreduceAlgorithm::automatic && size() > 1;
  }
  // What an adaptive plan running `chosen` checks against: the fastest other algorithm that the
  // calibration's probe nearest this size measured (on a log scale; the nearer smaller one on a
  // tie), else, for a given model, the model's best other than `chosen`.
  AllreduceAlgorithm runner_up(AllreduceAlgorithm chosen, std::size_t count, DType dtype) {
    const std::size_t es = (dtype == DType::f16 || dtype == DType::bf16) ? 4 : size_of(dtype);
    const double bytes = static_cast<double>(count * es);
    const detail::ModelView v = model_view();
    const CostModel& m = cost_model();
    const typename detail::CommState<Transport>::MeasuredOrder* near = nullptr;
    double d = 0;
    for (const auto& o : state_->measured) {
      const double e = std::fabs(std::log(std::max(bytes, 1.0) / static_cast<double>(o.bytes)));
      if (!near || e < d) {
        near = &o;
        d = e;
      }
    }
    if (near)
      for (AllreduceAlgorithm a : near->fastest_first)
        if (a != chosen && v.predict(m, a, count * es) < 1e299) return a;
    return v.best(m, count * es, chosen);
  }

  bool has_shared_segments() const noexcept {
    return shared_segments_of(*state_->transport) != nullptr;
  }

  std::shared_ptr<Impl> make_plan(const Spec& s) { return std::make_shared<Impl>(*state_, s); }

  // How `automatic` applies the cost model here: the candidates and their predictions.
  detail::ModelView model_view() const { return detail::topology_model_view(size(), topology_); }
  void adopt_model(const CostModel& m) {
    state_->cost = m;
    state_->decisions = detail::model_decisions(m, model_view());
  }

  static bool same_spec(const Spec& a, const Spec& b) {
    return a.kind == b.kind && a.algo == b.algo && a.op == b.op && a.dtype == b.dtype &&
           a.count == b.count && a.in == b.in && a.out == b.out && a.root == b.root &&
           a.runner_up == b.runner_up;
  }

  // Ad-hoc calls reuse the plan of an identical earlier call (same buffers and sizes), so a
  // training loop calling allreduce on the same gradient buffer allocates only on the first step.
  std::shared_ptr<Impl> cached_plan(const Spec& s) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (same_spec((*it)->spec(), s)) {
        const int st = (*it)->status.load();
        if (st == detail::Job::queued || st == detail::Job::running) break;  // busy: make another
        if (it != cache_.begin()) cache_.splice(cache_.begin(), cache_, it);
        return cache_.front();
      }
    }
    auto p = make_plan(s);
    cache_.push_front(p);
    if (cache_.size() > kCacheSize) cache_.pop_back();
    return p;
  }

  void run_adhoc(const Spec& s) { detail::execute_in_order(*state_, *cached_plan(s)); }

  CollectiveHandle start_adhoc(const Spec& s) {
    auto p = cached_plan(s);
    state_->engine.submit(*p);
    return CollectiveHandle(p.get(), p);
  }

  static constexpr std::size_t kCacheSize = 16;
  std::unique_ptr<detail::CommState<Transport>> state_;
  Topology topology_;
  std::list<std::shared_ptr<Impl>> cache_;
};

template <class Transport>
Communicator(Transport&) -> Communicator<Transport>;
template <class Transport>
Communicator(Transport&, CommConfig) -> Communicator<Transport>;

}  // namespace dtrain
