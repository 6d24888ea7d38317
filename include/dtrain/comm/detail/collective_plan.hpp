// SPDX-License-Identifier: BSD-3-Clause
// dtrain: planned collectives. A plan fixes buffers, sizes, algorithm, schedule, scratch memory
// and channels at construction, so execution allocates nothing.
//
// The plan holds one algorithm (one header each under algo/: ring.hpp with the
// reduce_scatter and allgather halves, tree.hpp, rhd.hpp, rd.hpp, shm.hpp (also ordered_shm),
// shm_parts.hpp for reduce_scatter and allgather on one node (from the heaps, else the ring's),
// broadcast.hpp, ordered.hpp for the reproducible all-reduce and reduce_scatter); a
// barrier is the fingerprint exchange alone. An all-reduce that `automatic` chose may also hold
// the plan of its runner-up, which it times against its own now and then and changes to when
// the ranks agree that it has become faster (adaptive.hpp). Every execution first exchanges call
// fingerprints (dissemination, ceil(log2 p) rounds) so that mismatched calls fail on every rank
// with each call and the ranks that made it named. avg is a sum divided by p exactly once, by the
// rank that finishes each element, so every rank ends with the same bits. 16-bit floats are
// widened to f32 once, reduced in f32 and rounded once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/detail/adaptive.hpp>
#include <dtrain/comm/detail/algo/broadcast.hpp>
#include <dtrain/comm/detail/algo/context.hpp>
#include <dtrain/comm/detail/algo/hier.hpp>
#include <dtrain/comm/detail/algo/ordered.hpp>
#include <dtrain/comm/detail/algo/rd.hpp>
#include <dtrain/comm/detail/algo/rhd.hpp>
#include <dtrain/comm/detail/algo/ring.hpp>
#include <dtrain/comm/detail/algo/shm.hpp>
#include <dtrain/comm/detail/algo/shm_parts.hpp>
#include <dtrain/comm/detail/algo/tree.hpp>
#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/detail/fingerprint.hpp>
#include <dtrain/comm/detail/futex_wait.hpp>
#include <dtrain/comm/detail/progress_engine.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// The algorithm object for a plan (construction: builds its schedule); null for a barrier.
template <class Transport>
std::unique_ptr<Algorithm> make_algorithm(PlanContext<Transport>& ctx, const void* in, void* out) {
  using T = Transport;
  const PlanSpec& s = ctx.spec();
  switch (s.kind) {
    case CollectiveKind::barrier:
    case CollectiveKind::calibrate: return nullptr;
    case CollectiveKind::broadcast: return std::make_unique<BroadcastAlgorithm<T>>(ctx, out);
    case CollectiveKind::reduce_scatter:
      if (s.algo == AllreduceAlgorithm::ordered)
        return std::make_unique<OrderedAlgorithm<T>>(ctx, in, out, false);
      if (ShmPartsAlgorithm<T>::usable(ctx))
        return std::make_unique<ShmPartsAlgorithm<T>>(ctx, in, out);
      return std::make_unique<RingReduceScatter<T>>(ctx, in, out);
    case CollectiveKind::allgather:
      if (ShmPartsAlgorithm<T>::usable(ctx))
        return std::make_unique<ShmPartsAlgorithm<T>>(ctx, in, out);
      return std::make_unique<RingAllgather<T>>(ctx, in, out);
    case CollectiveKind::allreduce:
      switch (s.algo) {
        case AllreduceAlgorithm::ring:
          return std::make_unique<RingAlgorithm<T>>(ctx, in, out, true, true);
        case AllreduceAlgorithm::tree: return std::make_unique<TreeAlgorithm<T>>(ctx, in, out);
        case AllreduceAlgorithm::rhd: return std::make_unique<RhdAlgorithm<T>>(ctx, in, out);
        case AllreduceAlgorithm::rd: return std::make_unique<RdAlgorithm<T>>(ctx, in, out);
        case AllreduceAlgorithm::shm: return std::make_unique<ShmAlgorithm<T>>(ctx, in, out);
        case AllreduceAlgorithm::hier: return std::make_unique<HierAlgorithm<T>>(ctx, in, out);
        case AllreduceAlgorithm::hier_leader:
          return std::make_unique<HierLeaderAlgorithm<T>>(ctx, in, out);
        case AllreduceAlgorithm::ordered:
          return std::make_unique<OrderedAlgorithm<T>>(ctx, in, out, true);
        case AllreduceAlgorithm::ordered_shm:
          return std::make_unique<ShmAlgorithm<T>>(ctx, in, out, true);
        case AllreduceAlgorithm::automatic: break;
      }
      raise<InvalidArgument>("allreduce plan", "algorithm must be resolved before planning");
  }
  return nullptr;
}

/// One planned collective on fixed buffers. Created by Communicator; executed by the caller's
/// thread or the progress thread, never both at once.
template <class Transport>
class PlanImpl final : public Job {
 public:
  using Spec = PlanSpec;

  PlanImpl(CommState<Transport>& comm, const Spec& s) : comm_(&comm), ctx_(comm, s) {
    const int p = ctx_.size(), r = ctx_.rank();
    // Everything this plan will ever send from or receive into is registered with the transport:
    // the caller's buffers here, scratch memory by PlanContext::scratch.
    ctx_.register_range(s.in, in_bytes(), s.space);
    ctx_.register_range(s.out, out_bytes(), s.space);
    ctx_.register_range(&check_mine_, sizeof(CheckState), Space::host);
    ctx_.register_range(&check_peer_, sizeof(CheckState), Space::host);
    if (p == 1) return;
    if (const SharedSegments* w = ctx_.shared_segments()) {
      Transport& t = *comm.transport;
      check_spin_ = segment_spin_seconds(node_map_of(t).machine_ranks(t.rank()),
                                         std::thread::hardware_concurrency(), w->slot_bytes);
    }
    for (int d = 1, round = 0; d < p; d <<= 1, ++round) {
      // One id per round, the same in every plan: a rank that skipped a call still meets its
      // peers here and the sequence numbers in the fingerprints tell what went wrong.
      ctx_.add_recv((r - d + p) % p, round, &check_peer_, sizeof(CheckState));
      ctx_.add_send((r + d) % p, round, &check_mine_, sizeof(CheckState));
    }
    const void* in = s.in;
    void* out = s.out;
    if (ctx_.widened()) {
      wide_in_ = reinterpret_cast<float*>(ctx_.scratch(s.count * sizeof(float)));
      in = wide_in_;
      wide_out_ = s.kind == CollectiveKind::allreduce
                      ? wide_in_
                      : reinterpret_cast<float*>(ctx_.scratch(out_count() * sizeof(float)));
      out = wide_out_;
    }
    algo_ = make_algorithm(ctx_, in, out);
    ctx_.bind_channels();
    if (s.kind == CollectiveKind::allreduce && s.runner_up != AllreduceAlgorithm::automatic &&
        s.runner_up != s.algo)
      adapt_ = std::make_unique<Adaptation>(comm, s);
  }

  ~PlanImpl() override {
    // A started plan must finish before its buffers go away; dropped by an unwinding error, it
    // is abandoned rather than waited for (as CollectiveHandle does).
    const int st = status.load();
    if ((st == queued || st == running) && engine) {
      if (std::uncaught_exceptions() > 0 || job_failing()) engine->abandon();
      try {
        engine->wait(*this);
      } catch (...) {
      }
    }
  }

  std::string label() const override {
    const Spec& s = ctx_.spec();
    return plan_label(make_fingerprint(s.kind, seq_, s.count, s.dtype, s.op, s.algo, s.root), s);
  }

  const Spec& spec() const noexcept { return ctx_.spec(); }
  CommState<Transport>* state() const noexcept { return comm_; }
  /// The algorithm the next execution runs outside a checking window: spec().algo, or the
  /// runner-up once an adaptive plan changed to it.
  AllreduceAlgorithm algorithm_in_use() const noexcept {
    return adapt_ && adapt_->schedule.swapped() ? adapt_->other->spec().algo : spec().algo;
  }
  /// The adaptive plan's schedule (windows, switches, last vote); null for other plans.
  const AdaptSchedule* adapt_schedule() const noexcept {
    return adapt_ ? &adapt_->schedule : nullptr;
  }

  /// Executes the collective once (blocking, on the calling thread). An adaptive plan runs the
  /// algorithm its schedule names, times it, and at the end of a window agrees with every rank
  /// on the window's timings (one all-reduce of 2 kAdaptBlock doubles).
  void run() override {
    if (!adapt_) {
      run_own();
      return;
    }
    AdaptSchedule& sch = adapt_->schedule;
    const bool runner = sch.next_is_runner_up();
    PlanImpl& which = runner != sch.swapped() ? *adapt_->other : *this;
    const std::uint64_t n = sch.executions();
    const double t0 = now_seconds();
    which.run_own();
    double dt = now_seconds() - t0;
    if (sch.timing()) {
      if (const auto& hook = adapt_hook())
        dt = hook(AdaptSample{ctx_.rank(), which.spec().algo, in_bytes(), n, dt});
    }
    if (!sch.record(dt)) return;
    adapt_->ballot->run_own();  // sch.samples() becomes the slowest rank's, on every rank
    sch.decide();
  }

 private:
  // The runner-up's plan on the same buffers, and the vote: the maximum over ranks of each timed
  // execution of the window, in place (rd, no fingerprint round: every rank reaches it at the
  // same execution of this plan, right after it).
  struct Adaptation {
    Adaptation(CommState<Transport>& comm, const Spec& s) {
      Spec o = s;
      o.algo = s.runner_up;
      o.runner_up = AllreduceAlgorithm::automatic;
      other = std::make_unique<PlanImpl>(comm, o);
      Spec v;
      v.kind = CollectiveKind::allreduce;
      v.algo = AllreduceAlgorithm::rd;
      v.op = ReduceOp::max;
      v.dtype = DType::f64;
      v.count = schedule.samples().size();
      v.in = schedule.samples().data();
      v.out = schedule.samples().data();
      v.check = false;
      v.during = "an adaptive plan's check of its algorithm";
      ballot = std::make_unique<PlanImpl>(comm, v);
    }
    AdaptSchedule schedule;
    std::unique_ptr<PlanImpl> other, ballot;
  };

  // One execution of this plan's own algorithm.
  void run_own() {
    const Spec& s = ctx_.spec();
    comm_->check_usable(name_of(s.kind));  // also refuses to start on an abandoned engine
    seq_ = comm_->seq.fetch_add(1);
    ctx_.begin(seq_);
    if (ctx_.size() == 1) {
      run_single();
      return;
    }
    try {
      if ((comm_->config.check_fingerprints && s.check) || s.kind == CollectiveKind::barrier)
        check();
      if (!algo_) return;
      if (wide_in_) host::widen(s.dtype, s.in, wide_in_, s.count);
      algo_->run();
      if (wide_out_) host::narrow(s.dtype, wide_out_, s.out, out_count());
    } catch (const std::exception& e) {
      const std::size_t stuck = ctx_.cancel_all();
      comm_->mark_broken(e.what());
      if (stuck) rethrow_with_note(e, stuck);
      throw;
    }
  }

  std::size_t part_count() const noexcept {
    const Spec& s = ctx_.spec();
    return block_begin(s.count, ctx_.size(), ctx_.rank() + 1) -
           block_begin(s.count, ctx_.size(), ctx_.rank());
  }
  std::size_t in_count() const noexcept {
    switch (ctx_.spec().kind) {
      case CollectiveKind::allgather: return part_count();
      case CollectiveKind::allreduce:
      case CollectiveKind::reduce_scatter: return ctx_.spec().count;
      default: return 0;
    }
  }
  std::size_t out_count() const noexcept {
    switch (ctx_.spec().kind) {
      case CollectiveKind::reduce_scatter: return part_count();
      case CollectiveKind::barrier:
      case CollectiveKind::calibrate: return 0;
      default: return ctx_.spec().count;
    }
  }
  std::size_t in_bytes() const noexcept { return in_count() * size_of(ctx_.spec().dtype); }
  std::size_t out_bytes() const noexcept { return out_count() * size_of(ctx_.spec().dtype); }

  void run_single() {
    const Spec& s = ctx_.spec();
    const std::size_t bytes = out_bytes();
    const void* in = s.kind == CollectiveKind::broadcast ? s.out : s.in;
    if (bytes && in != s.out) std::memcpy(s.out, in, bytes);
  }

  // The same error, saying that transfers outlive it: the caller's buffers of this collective
  // may still be read or written by MPI, so they must stay allocated until the job ends.
  [[noreturn]] static void rethrow_with_note(const std::exception& e, std::size_t stuck) {
    const std::string what =
        concat(e.what(), " [", stuck,
               " transfer(s) could not be cancelled: MPI may still access this collective's "
               "buffers, keep them allocated until the job ends (FailurePolicy::abort_job ends "
               "it at once)]");
    if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(what);
    if (dynamic_cast<const RemoteError*>(&e)) throw RemoteError(what);
    if (dynamic_cast<const TransportError*>(&e)) throw TransportError(what);
    throw;
  }

  // The fingerprint exchange (also the barrier): through the node-shared segments where every
  // rank has them and they are few (check_in_segments), else channel pairs 0.. of the plan, one
  // per round of a dissemination.
  void check() {
    if (SharedSegments* w = ctx_.shared_segments(); w && ctx_.size() <= kSegmentCheckRanks) {
      check_in_segments(*w);
      return;
    }
    check_mine_ = CheckState::of(ctx_.fingerprint(), ctx_.rank());
    for (std::size_t i = 0; 2 * i + 1 < check_channels(); ++i) {
      ctx_.start(2 * i);
      ctx_.start(2 * i + 1);
      ctx_.wait(2 * i);
      ctx_.wait(2 * i + 1);
      check_mine_.merge(check_peer_);
    }
    if (check_mine_.mismatch())
      raise<RemoteError>(plan_label(ctx_.fingerprint(), ctx_.spec()),
                         check_mine_.report(ctx_.size()));
  }
  // Every rank leaves its fingerprint in its check line for check number c (one per checked
  // plan execution, in the same order on every rank), raises its check counter, and reads every
  // other rank's line once that rank's counter shows c: a barrier, and a comparison in which
  // every rank sees the same fingerprints and so reports the same groups of ranks by call.
  // Against the message rounds: one hand-off instead of ceil(log2 p) round trips through MPI
  // (2 ranks here: 0.3-0.5 us less per call; benchmarks/RESULTS.md), but p - 1 lines to read,
  // hence only up to kSegmentCheckRanks ranks. Two lines alternate: a rank
  // writes check c + 2 only after reading every rank's check c + 1, which every rank raised after
  // reading check c. A rank that skipped a call reaches the others' next check with its
  // fingerprint of the call after: a mismatch, as with messages.
  void check_in_segments(SharedSegments& w) {
    const int p = ctx_.size(), r = ctx_.rank();
    const std::uint64_t c = w.next_check++;
    const Fingerprint mine = ctx_.fingerprint();
    std::memcpy(w.check_line(r, c), &mine, sizeof(mine));
    counter_publish(w.check_flag(r), c + 1);
    Fingerprint all[kSegmentCheckRanks];
    bool differs = false;
    for (int q = 0; q < p; ++q) {
      all[q] = mine;
      if (q != r) {
        if (!counter_wait(w.check_flag(q), c + 1, ctx_.deadline(), check_spin_, kFutexSliceSeconds,
                          ctx_.wait_progress()))
          ctx_.timeout(ctx_.transport_rank(q));
        std::memcpy(&all[q], w.check_line(q, c), sizeof(Fingerprint));
      }
      differs = differs || all[q] != all[0];
    }
    if (!differs) return;
    std::vector<CallGroup> groups;
    for (int q = 0; q < p; ++q) {
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const CallGroup& x) { return x.call == all[q]; });
      if (g == groups.end()) g = groups.insert(groups.end(), CallGroup{all[q], {}});
      g->ranks.push_back(q);
    }
    raise<RemoteError>(plan_label(ctx_.fingerprint(), ctx_.spec()),
                       mismatch_report(std::move(groups)));
  }
  static constexpr int kSegmentCheckRanks = 8;

  std::size_t check_channels() const noexcept {
    std::size_t rounds = 0;
    for (int d = 1; d < ctx_.size(); d <<= 1) ++rounds;
    return 2 * rounds;
  }

  CommState<Transport>* comm_;
  double check_spin_ = Backoff::kSpinSeconds;  // check_in_segments' waits (as shm's)
  CheckState check_mine_{}, check_peer_{};
  PlanContext<Transport> ctx_;
  float* wide_in_ = nullptr;
  float* wide_out_ = nullptr;
  std::unique_ptr<Algorithm> algo_;
  std::uint64_t seq_ = 0;
  std::unique_ptr<Adaptation> adapt_;
};

}  // namespace dtrain::detail
