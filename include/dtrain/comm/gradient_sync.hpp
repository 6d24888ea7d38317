// SPDX-License-Identifier: BSD-3-Clause
// dtrain: gradient averaging in buckets, overlapped with the backward pass.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/collective_handle.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/device_allreduce.hpp>
#include <dtrain/comm/detail/device_ipc.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>

namespace dtrain {

namespace detail {
// Starts bucket i's planned all-reduce; hides the transport type from GradientSync's users.
// With sharded updates, also bucket i's reduce_scatter of the gradients and all-gather of the
// parameters, and all-gathers of other arenas' parts (the optimizer state).
struct BucketLauncher {
  virtual ~BucketLauncher() = default;
  virtual CollectiveHandle start(std::size_t i) = 0;
  virtual AllreduceAlgorithm algorithm(std::size_t i) const = 0;
  virtual int algorithm_changes(std::size_t i) const = 0;
  virtual void plan_parts(BufferView grad_bucket, BufferView grad_part, BufferView param_part,
                          BufferView param_bucket, bool check_fingerprints) = 0;
  virtual CollectiveHandle start_reduce_scatter(std::size_t i) = 0;
  virtual CollectiveHandle start_allgather(std::size_t i) = 0;
  virtual void allgather(BufferView part, BufferView whole) = 0;
};

template <class Transport>
struct PlannedBuckets final : BucketLauncher {
  explicit PlannedBuckets(Communicator<Transport>& c) : comm(&c) {}
  Communicator<Transport>* comm;
  std::vector<CollectivePlan<Transport>> plans, scatters, gathers;
  CollectiveHandle start(std::size_t i) override { return plans[i].start(); }
  AllreduceAlgorithm algorithm(std::size_t i) const override { return plans[i].algorithm(); }
  int algorithm_changes(std::size_t i) const override { return plans[i].algorithm_changes(); }
  void plan_parts(BufferView grad_bucket, BufferView grad_part, BufferView param_part,
                  BufferView param_bucket, bool check_fingerprints) override {
    scatters.push_back(
        comm->plan_reduce_scatter(grad_bucket, grad_part, ReduceOp::avg, check_fingerprints));
    gathers.push_back(comm->plan_allgather(param_part, param_bucket, false));
  }
  CollectiveHandle start_reduce_scatter(std::size_t i) override { return scatters[i].start(); }
  CollectiveHandle start_allgather(std::size_t i) override { return gathers[i].start(); }
  void allgather(BufferView part, BufferView whole) override { comm->allgather(part, whole); }
};
// Whether an optimizer can keep its state for some parts of the arena (sharded updates).
template <class O, class = void>
struct has_state_shards : std::false_type {};
template <class O>
struct has_state_shards<
    O, std::void_t<decltype(std::declval<O&>().shard_state(
           std::declval<const std::vector<std::pair<std::size_t, std::size_t>>&>()))>>
    : std::true_type {};
}  // namespace detail

/// Averages a gradient arena across the ranks of a communicator, bucket by bucket, while the
/// backward pass is still producing earlier layers' gradients. Generic over the execution policy
/// Exec that computes the gradients (HostExec by default).
///
/// Buckets are contiguous element ranges planned once at construction, starting from the END of
/// the arena (backward produces the last layer's gradients first). ready(offset, count) marks
/// elements final in stream order: once a bucket's elements are all reported, an event is
/// recorded on the policy's compute stream, and the bucket's non-blocking all-reduce(avg) starts
/// once that event has completed (checked without blocking in ready(), waited for in wait()).
/// With HostExec the event is complete at once, so the bucket starts inside ready().
///
/// Device gradients are handed over or staged, chosen once here and logged (rank 0 at info).
/// Handed over where the transport takes device buffers as they are (device_buffers_of: its
/// run-time answer, e.g. MpiTransport's from the MPI library and DTRAIN_MPI_GPU_AWARE) and the
/// policy reduces the gradients' type (f32, f64, i32, i64; f16 and bf16 where it has convert(),
/// widened once into an f32 accumulator): each bucket goes to the transport directly and is
/// averaged on the device (detail/device_allreduce.hpp: a direct reduce-scatter and all-gather,
/// the parts reduced in rank order by the policy's reduce_into and scale_avg, the bits of the
/// ordered all-reduce; device scratch of (p-1)/p of the arena); the host never touches the
/// gradients. Sharded steps (shard_updates) hand over their reduce-scatters and the parameters'
/// all-gathers alike.
/// A bucket's parts are sent once its event completes; ready() then moves the started buckets
/// on without blocking (reduction queued once their parts arrived, averages sent once it is
/// done), and wait() completes what is left.
/// Handed-over buckets exchange no call fingerprints: a rank out of step shows as a TimeoutError
/// naming the hand-over, the bucket and the peer, or as the transport's size mismatch.
/// Through device IPC instead, where the policy can share its device memory between processes
/// (has_exec_ipc_v, ipc_available()), some node has several ranks, the nodes are blocks of
/// consecutive ranks and DTRAIN_DEVICE_IPC is not 0 (detail/device_ipc.hpp: each rank's window
/// opened by the ranks of its node once, here, so construction is then collective over the node;
/// each bucket copied into the window, its parts reduced in rank order by their owners straight
/// from the node's windows, node after node between nodes over the transport, and copied back
/// out; device_ipc()). Decided once here with the hand-over, and logged with it.
/// Staged otherwise: a copy stream waits for the bucket's event and copies it to a host mirror
/// (pinned, from the policy's host allocator); the all-reduce runs on the mirror; the average is
/// copied back on a second stream while later buckets are still copied out or reduced, and the
/// compute stream waits for it. Host gradients go to the communicator directly.
///
/// Buckets always start in the same order (a bucket that completes early waits for the ones
/// before it), so every rank issues the same collectives in the same order. Only the first
/// bucket of a step exchanges call fingerprints (when the communicator checks them), one latency
/// round per step instead of one per bucket: it catches a rank out of step (a collective missing
/// or extra) and a first bucket of another size; a layout that differs only in later buckets
/// shows at the next step's check, or earlier as a failed transfer. With a communicator in
/// reproducible mode (CommConfig::reproducible) each element's average is the rank-order sum
/// divided by p, so the bits do not depend on bucket_bytes or `algo` either. wait() completes
/// every bucket and resets for the next step; wait(optimizer) also applies the optimizer to each
/// bucket as soon as its average has arrived, while later buckets are still being reduced.
///
/// Local object of one rank, used by one thread (the compute thread); the arena, the policy and
/// the communicator are owned by the caller and must outlive it. Every rank must construct it
/// with the same sizes and report the same elements each step.
template <class Exec = HostExec>
class BasicGradientSync {
  static_assert(detail::check_exec_policy<Exec>(), "BasicGradientSync needs an execution policy");

 public:
  using exec_type = Exec;

  /// Local (collective only if `automatic` needs the communicator's cost model measured, and over
  /// the node with device IPC: the windows' handles are exchanged here, bounded by the
  /// communicator's timeout). `grads` is exec memory of `exec`.
  template <class Transport>
  BasicGradientSync(Exec& exec, Communicator<Transport>& comm, BufferView grads,
                    std::size_t bucket_bytes,
                    AllreduceAlgorithm algo = AllreduceAlgorithm::automatic)
      : exec_(&exec), grads_(grads) {
    DTRAIN_REQUIRE(bucket_bytes > 0, "GradientSync", "bucket_bytes must be positive");
    DTRAIN_REQUIRE(grads.space == Exec::space, "GradientSync",
                   "the execution policy runs on " << name_of(Exec::space)
                                                   << " memory but the gradients live in "
                                                   << name_of(grads.space) << " memory");
    const std::size_t es = size_of(grads.dtype);
    per_bucket_ = bucket_bytes / es > 0 ? bucket_bytes / es : 1;
    const std::size_t n = grads.count;
    const std::size_t nb = n == 0 ? 0 : (n + per_bucket_ - 1) / per_bucket_;
    detail::DeviceIpcChoice ipc;
    if (grads.space != Space::host) {
      const DeviceBuffers d = device_buffers_of(comm.transport(), grads.space);
      handed_over_ = d.handed_over && detail::handover_reduces_on<Exec>(grads.dtype);
      staged_ = !handed_over_;
      // Rank 0 tells the run; the others only at debug level.
      const std::string how =
          handed_over_ ? "handed to the transport and averaged on the device (" + d.why + ")"
          : d.handed_over
              ? "staged through host memory (" + detail::handover_refusal(grads.dtype) + ")"
              : "staged through host memory (" + d.why + ")";
      ipc = detail::device_ipc_choice(comm.transport(), exec, grads.dtype, d);
      ipc_ = ipc.use;
      handed_over_ = handed_over_ || ipc_;
      staged_ = !handed_over_;
      const std::string said = ipc_ ? ipc.why : how + "; " + ipc.why;
      if (comm.rank() == 0)
        DTRAIN_LOG(info, "GradientSync: " << name_of(grads.space) << " gradients " << said);
      else
        DTRAIN_LOG(debug, "GradientSync: " << name_of(grads.space) << " gradients " << said);
    }
    BufferView target = grads;
    if (staged_) {
      mirror_ = Tensor({static_cast<std::int64_t>(n)}, grads.dtype, exec.host_allocator());
      target = mirror_.view();
    }
    auto launcher = std::make_unique<detail::PlannedBuckets<Transport>>(comm);
    std::vector<BufferView> device_buckets;
    for (std::size_t i = 0; i < nb; ++i) {
      const std::size_t end = n - i * per_bucket_;
      const std::size_t begin = end > per_bucket_ ? end - per_bucket_ : 0;
      ranges_.emplace_back(begin, end - begin);
      BufferView v = target.slice(begin, end - begin);
      // The buckets run in a fixed order every step: the first checks the call fingerprints
      // for the step (every rank at the same collective, same sizes), the others skip that
      // latency round.
      if (handed_over_)
        device_buckets.push_back(v);
      else
        launcher->plans.push_back(comm.plan_allreduce(v, v, ReduceOp::avg, algo, i == 0));
      ready_events_.emplace_back(exec);
      if (staged_) {
        copied_events_.emplace_back(exec);
        back_events_.emplace_back(exec);
      }
    }
    if (staged_) {
      d2h_ = ExecStream<Exec>(exec);
      h2d_ = ExecStream<Exec>(exec);
    }
    if (ipc_)
      device_ = detail::make_device_ipc(comm.transport(), exec, device_buckets, ipc.direct,
                                        comm.config().timeout_s);
    else if (handed_over_)
      device_ = std::make_unique<detail::DeviceBucketAllreduce<Transport, Exec>>(
          comm.transport(), exec, device_buckets, comm.config().timeout_s);
    // Sharded steps take the buckets' reduce-scatters and all-gathers apart (null for another
    // reducer).
    exchange_ = dynamic_cast<detail::DeviceExchange<Exec>*>(device_.get());
    launcher_ = std::move(launcher);
    ready_.assign(nb, 0);
    handles_.resize(nb);
    rank_ = comm.rank();
    size_ = comm.size();
  }
  /// Host gradients on the process-wide HostExec.
  template <class Transport, class E = Exec, class = std::enable_if_t<std::is_same_v<E, HostExec>>>
  BasicGradientSync(Communicator<Transport>& comm, BufferView grads, std::size_t bucket_bytes,
                    AllreduceAlgorithm algo = AllreduceAlgorithm::automatic)
      : BasicGradientSync(HostExec::instance(), comm, grads, bucket_bytes, algo) {}

  BasicGradientSync(const BasicGradientSync&) = delete;
  BasicGradientSync& operator=(const BasicGradientSync&) = delete;
  ~BasicGradientSync() = default;  // handles wait for running buckets, streams for their copies

  /// Local, non-blocking: elements [offset, offset+count) of the arena are final in stream order
  /// (their kernels are queued on the compute stream). Each element must be reported at most
  /// once per step. Records the event of every bucket that became complete (in bucket order)
  /// and starts those whose event has completed.
  void ready(std::size_t offset, std::size_t count) {
    DTRAIN_REQUIRE(offset <= grads_.count && count <= grads_.count - offset, "GradientSync::ready",
                   "range [" << offset << ", " << offset + count << ") outside the arena of "
                             << grads_.count << " elements");
    if (count == 0) return;
    const std::size_t first = bucket_of(offset + count - 1), last = bucket_of(offset);
    auto overlap = [&](std::size_t b) {
      const std::size_t b0 = ranges_[b].first, b1 = b0 + ranges_[b].second;
      const std::size_t lo = offset > b0 ? offset : b0;
      const std::size_t hi = offset + count < b1 ? offset + count : b1;
      return hi - lo;
    };
    // Check every bucket before changing any, so a rejected call leaves the step intact.
    for (std::size_t b = first; b <= last; ++b)
      DTRAIN_REQUIRE(ready_[b] + overlap(b) <= ranges_[b].second, "GradientSync::ready",
                     "elements of bucket " << b << " [" << ranges_[b].first << ", "
                                           << ranges_[b].first + ranges_[b].second
                                           << ") reported ready more than once this step");
    for (std::size_t b = first; b <= last; ++b) ready_[b] += overlap(b);
    advance();
  }

  /// Local, non-blocking: marks everything not yet reported as final and queues those buckets.
  void ready_all() {
    for (std::size_t b = 0; b < ready_.size(); ++b) ready_[b] = ranges_[b].second;
    advance();
  }

  /// Collective (through the buckets), blocking: completes every bucket, rethrowing the first
  /// failure (bounded by the communicator's deadline; waits for device events by
  /// exec_timeout_s()), and resets for the next step. Later work on the compute stream sees the
  /// averages. Throws InvalidArgument when some elements were never reported ready.
  void wait() { finish(nullptr); }

  /// As wait(), and applies `opt` (anything with update(offset, count) and complete_step(), such
  /// as Sgd or AdamW on the same arena and policy) to each bucket as soon as its average has
  /// arrived, then completes the optimizer's step: the same bits as wait() then opt.step(). On a
  /// failure no further bucket is updated and the step is not completed.
  template <class Optimizer>
  void wait(Optimizer& opt) {
    Updater u{&opt, [](void* o, std::size_t off, std::size_t c) {
                static_cast<Optimizer*>(o)->update(off, c);
              }};
    if constexpr (detail::has_state_shards<Optimizer>::value) {
      if (sharded_) {
        try {
          opt.shard_state(state_parts_);
        } catch (...) {
          // The step's reduce-scatters may be running: complete them (nothing updated) before the
          // error leaves, so that the sync is ready for the next step.
          const std::exception_ptr err = std::current_exception();
          try {
            finish(nullptr);
          } catch (...) {
          }
          std::rethrow_exception(err);
        }
      }
    } else {
      DTRAIN_REQUIRE(!sharded_, "GradientSync::wait",
                     "sharded updates need an optimizer with shard_state, unshard_state, "
                     "set_state_partial and for_each_state_arena (Sgd, AdamW)");
    }
    if (finish(&u)) opt.complete_step();
  }

  /// Local. From the next step on, wait(optimizer) runs a sharded step (every rank must call it
  /// alike, between steps): each bucket's gradients are reduce-scattered (averaged in place; rank
  /// r gets part r of the bucket, partition_begin's split), the optimizer updates only this
  /// rank's part of each bucket as soon as it has arrived, and each bucket's parameters are then
  /// all-gathered from their owners, while later buckets are still reduced and updated. Every
  /// rank ends the step with the same parameters as the unsharded step, each updated once
  /// instead of on every rank: on 2 ranks the same bits (an average of two is the same sum in
  /// either order); on more, the bits of a reduce-scatter, which sums in another order than the
  /// all-reduce except in reproducible mode (rank order in both). `params` is the arena
  /// `wait(optimizer)`'s optimizer updates, laid out as the gradients (same count, type and
  /// memory). On one node with both arenas in the node-shared heaps (Communicator::
  /// shared_allocator), each collective is one hand-off read in place (algo/shm_parts.hpp).
  ///
  /// Afterwards the gradients outside this rank's parts are not averaged (clip before the sync's
  /// wait, or not at all), and the optimizer keeps its state for this rank's parts only
  /// (shard_state: about 1/p of it in memory, from the first sharded step on, or at once with
  /// shard_updates(params, optimizer)); it says so
  /// (state_partial()) until gather_state(optimizer) makes it whole again. A Checkpointer saves
  /// it without the gather (each rank's parts, assembled on rank 0 into the whole state's
  /// datasets). Device gradients handed over (handed_over()) run the step on the device: each
  /// part is averaged by the device reduction, the compute stream waits for it on an event, the
  /// update is queued there, and the parameters' all-gather is posted once an event behind the
  /// update has completed (no stream synchronisation). Not with staged device gradients. With
  /// one rank it changes nothing (sharded() stays false).
  void shard_updates(BufferView params) {
    DTRAIN_REQUIRE(grads_.space == Space::host || exchange_, "GradientSync::shard_updates",
                   "sharded updates need host gradients or device gradients handed over to the "
                   "transport (these device gradients are "
                       << (staged_ ? "staged through host memory"
                           : ipc_  ? "averaged through device IPC within the node: "
                                     "sharded steps need DTRAIN_DEVICE_IPC=0 and a GPU-aware MPI"
                                   : "not handed over")
                       << ")");
    DTRAIN_REQUIRE(params.count == grads_.count && params.dtype == grads_.dtype &&
                       params.space == grads_.space,
                   "GradientSync::shard_updates",
                   "the parameters must be laid out as the gradients: "
                       << grads_.count << " x " << name_of(grads_.dtype) << " in "
                       << name_of(grads_.space) << " memory, got " << params.count << " x "
                       << name_of(params.dtype) << " in " << name_of(params.space) << " memory");
    DTRAIN_REQUIRE(started_ == 0 && queued_ == 0, "GradientSync::shard_updates",
                   "call it between steps");
    // One rank has nothing to share out: its steps stay whole (two collectives per bucket that
    // move nothing would only cost their hand-offs).
    if (sharded_ || size_ == 1) return;
    for (std::size_t b = 0; b < ranges_.size(); ++b) {
      const std::size_t first = ranges_[b].first, len = ranges_[b].second;
      const std::size_t off = first + partition_begin(len, size_, rank_);
      const std::size_t cnt = partition_count(len, size_, rank_);
      if (handed_over_)
        exchange_->set_gather(b, params.slice(off, cnt), params.slice(first, len));
      else
        launcher_->plan_parts(grads_.slice(first, len), grads_.slice(off, cnt),
                              params.slice(off, cnt), params.slice(first, len), b == 0);
      parts_.emplace_back(off, cnt);
    }
    // Bucket 0 is the end of the arena: the optimizer takes the parts in ascending order.
    state_parts_.assign(parts_.rbegin(), parts_.rend());
    gather_handles_.resize(ranges_.size());
    sharded_ = true;
  }
  /// As shard_updates(params), and shards `opt`'s state at once (shard_state with this rank's
  /// parts), so that it is never whole-sized on this rank where it was not used yet (Sgd and
  /// AdamW make their state on first use): the memory saving starts before the first step, and
  /// a restore into it loads this rank's parts only. Local.
  template <class Optimizer>
  void shard_updates(BufferView params, Optimizer& opt) {
    static_assert(detail::has_state_shards<Optimizer>::value,
                  "GradientSync::shard_updates: the optimizer has no shard_state (Sgd and AdamW "
                  "have)");
    shard_updates(params);
    if (sharded_) opt.shard_state(state_parts_);
  }
  /// Whether wait(optimizer) runs sharded steps (shard_updates).
  bool sharded() const noexcept { return sharded_; }

  /// Collective, blocking, between steps: makes the state of `opt` (anything with unshard_state,
  /// for_each_state_arena and set_state_partial, such as Sgd or AdamW) whole on every rank after
  /// sharded steps: whole-sized arenas again (the memory of the unsharded state, until the next
  /// sharded step frees it), each arena's parts all-gathered bucket by bucket. Needed before the
  /// state is read whole (a Checkpointer's save does without it).
  template <class Optimizer>
  void gather_state(Optimizer& opt) {
    DTRAIN_REQUIRE(started_ == 0 && queued_ == 0, "GradientSync::gather_state",
                   "call it between steps");
    if (sharded_) {
      // The last step's updates of the state, queued on the compute stream, are done.
      exec_synchronize(*exec_, exec_->compute_stream(), exec_timeout_s(),
                       "GradientSync::gather_state");
      opt.unshard_state();
      opt.for_each_state_arena([&](BufferView arena) {
        DTRAIN_REQUIRE(
            arena.count == grads_.count, "GradientSync::gather_state",
            "a state arena of " << arena.count << " elements for an arena of " << grads_.count);
        for (std::size_t b = 0; b < ranges_.size(); ++b) {
          const BufferView part = arena.slice(parts_[b].first, parts_[b].second);
          const BufferView whole = arena.slice(ranges_[b].first, ranges_[b].second);
          if (handed_over_)
            exchange_->allgather(part, whole);
          else
            launcher_->allgather(part, whole);
        }
      });
    }
    opt.set_state_partial(false);
  }

  /// ready_all() then wait(): for code that does not overlap.
  void sync_all() {
    ready_all();
    wait();
  }

  /// Number of buckets; bucket 0 is the last part of the arena.
  std::size_t bucket_count() const noexcept { return ranges_.size(); }
  /// (first element, element count) of bucket i.
  std::pair<std::size_t, std::size_t> bucket_range(std::size_t i) const { return ranges_.at(i); }
  /// The algorithm bucket i's all-reduce runs now, and how often it changed so far (an
  /// `automatic` bucket checks its choice while in use: CommConfig::adaptive). Local; call
  /// between steps (a running bucket may be changing it). Handed-over buckets report `ordered`
  /// (their parts are reduced in rank order, the ordered all-reduce's bits) and never change.
  AllreduceAlgorithm bucket_algorithm(std::size_t i) const {
    DTRAIN_REQUIRE(i < ranges_.size(), "GradientSync::bucket_algorithm",
                   "bucket " << i << " of " << ranges_.size());
    return handed_over_ ? AllreduceAlgorithm::ordered : launcher_->algorithm(i);
  }
  int bucket_algorithm_changes(std::size_t i) const {
    DTRAIN_REQUIRE(i < ranges_.size(), "GradientSync::bucket_algorithm_changes",
                   "bucket " << i << " of " << ranges_.size());
    return handed_over_ ? 0 : launcher_->algorithm_changes(i);
  }
  /// Buckets whose all-reduce has started so far this step.
  std::size_t buckets_started() const noexcept { return started_; }
  /// Whether device buckets are staged through host memory, or handed over to the transport and
  /// averaged on the device (see the class comment); both false for host gradients.
  bool staged() const noexcept { return staged_; }
  bool handed_over() const noexcept { return handed_over_ && !ipc_; }
  /// Whether device buckets are averaged through device IPC among the ranks of each node (see
  /// the class comment); then neither staged() nor handed_over().
  bool device_ipc() const noexcept { return ipc_; }
  /// Non-blocking: whether bucket i's all-reduce has completed (false if not started). Rethrows
  /// its failure.
  /// A handed-over bucket completes in wait() only.
  bool bucket_done(std::size_t i) {
    if (i >= started_ || handed_over_) return false;
    return handles_[i].test();
  }

 private:
  struct Updater {
    void* opt;
    void (*update)(void*, std::size_t, std::size_t);
  };

  std::size_t bucket_of(std::size_t element) const noexcept {
    return (grads_.count - 1 - element) / per_bucket_;
  }
  typename Exec::event_type gate(std::size_t b) const {
    return staged_ ? copied_events_[b].get() : ready_events_[b].get();
  }
  BufferView arena_slice(std::size_t b) const {
    return grads_.slice(ranges_[b].first, ranges_[b].second);
  }
  BufferView mirror_slice(std::size_t b) const {
    return mirror_.view().slice(ranges_[b].first, ranges_[b].second);
  }

  // Queues every newly complete bucket (in order) and starts those whose data is in place.
  void advance() {
    Exec& e = *exec_;
    while (queued_ < ready_.size() && ready_[queued_] == ranges_[queued_].second) {
      const std::size_t b = queued_;
      e.record(ready_events_[b].get(), e.compute_stream());
      if (staged_) {
        const BufferView src = arena_slice(b), dst = mirror_slice(b);
        e.stream_wait(d2h_.get(), ready_events_[b].get());
        e.copy_d2h(d2h_.get(), dst.data, src.data, src.bytes());
        e.record(copied_events_[b].get(), d2h_.get());
      }
      ++queued_;
    }
    while (started_ < queued_ && e.query(gate(started_))) start(started_);
    // Handed-over buckets move on without blocking (reduction queued, averages sent), in order.
    if (handed_over_)
      while (progressed_ < started_ &&
             (sharded_ ? exchange_->scatter_progress(progressed_) : device_->progress(progressed_)))
        ++progressed_;
  }

  void start(std::size_t b) {
    if (handed_over_)
      device_->start(b);
    else
      handles_[b] = sharded_ ? launcher_->start_reduce_scatter(b) : launcher_->start(b);
    ++started_;
  }

  // Completes the step; returns true when every bucket was averaged (and updated, with `u`).
  bool finish(const Updater* u) {
    Exec& e = *exec_;
    std::exception_ptr first;
    try {
      for (std::size_t b = started_; b < queued_; ++b) {
        exec_wait(e, gate(b), exec_timeout_s(), "GradientSync::wait (gradients of a bucket)");
        start(b);
      }
    } catch (...) {
      first = std::current_exception();
    }
    // Handed-over sharded steps: bucket b's all-gather of the updated parameters is posted once
    // the event recorded behind its update has completed, in bucket order.
    std::size_t updated = 0;
    auto post_gathers = [&](bool block) {
      for (; gathers_started_ < updated; ++gathers_started_) {
        const auto ev = ready_events_[gathers_started_].get();
        if (block)
          exec_wait(e, ev, exec_timeout_s(), "GradientSync::wait (a bucket's update)");
        else if (!e.query(ev))
          return;
        exchange_->start_gather(gathers_started_);
      }
    };
    for (std::size_t b = 0; b < started_; ++b) {
      try {
        if (handed_over_) {
          if (first) {
            device_->cancel(b);
            continue;
          }
          if (sharded_) {
            exchange_->finish_scatter(b);
            // The update reads the average once the device reduction has written it.
            e.stream_wait(e.compute_stream(), exchange_->reduced_event(b));
          } else {
            device_->finish(b);
          }
        } else {
          handles_[b].wait();
        }
        if (first) continue;
        if (staged_) {
          const BufferView src = mirror_slice(b), dst = arena_slice(b);
          e.copy_h2d(h2d_.get(), dst.data, src.data, src.bytes());
          e.record(back_events_[b].get(), h2d_.get());
          e.stream_wait(e.compute_stream(), back_events_[b].get());
        }
        if (sharded_) {
          if (!u) continue;
          u->update(u->opt, parts_[b].first, parts_[b].second);
          if (handed_over_) {
            // Bucket b's event again, behind its update (its gradients' use of it is over).
            e.record(ready_events_[b].get(), e.compute_stream());
            ++updated;
            post_gathers(false);
            continue;
          }
          // The owners' parts once updated: the update queued on the compute stream finished
          // (at once on the host).
          exec_synchronize(e, e.compute_stream(), exec_timeout_s(),
                           "GradientSync::wait (a bucket's update)");
          gather_handles_[b] = launcher_->start_allgather(b);
          ++gathers_started_;
        } else if (u) {
          u->update(u->opt, ranges_[b].first, ranges_[b].second);
        }
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (handed_over_ && !first) {
      try {
        post_gathers(true);
      } catch (...) {
        first = std::current_exception();
      }
    }
    for (std::size_t b = 0; b < gathers_started_; ++b) {
      try {
        if (!handed_over_)
          gather_handles_[b].wait();
        else if (first)
          device_->cancel(b);
        else
          exchange_->finish_gather(b, e.compute_stream());
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    gathers_started_ = 0;
    progressed_ = 0;
    const std::size_t queued = queued_;
    started_ = 0;
    queued_ = 0;
    std::size_t missing_bucket = ready_.size();
    for (std::size_t b = 0; b < ready_.size(); ++b) {
      if (missing_bucket == ready_.size() && ready_[b] != ranges_[b].second) missing_bucket = b;
      ready_[b] = 0;
    }
    if (first) std::rethrow_exception(first);
    DTRAIN_REQUIRE(!sharded_ || u, "GradientSync::wait",
                   "with sharded updates (shard_updates) the step needs wait(optimizer); the "
                   "gradients were reduce-scattered, the parameters not updated");
    DTRAIN_REQUIRE(queued == ready_.size(), "GradientSync::wait",
                   "bucket " << missing_bucket << " [" << ranges_[missing_bucket].first << ", "
                             << ranges_[missing_bucket].first + ranges_[missing_bucket].second
                             << ") was not completely reported ready this step");
    return true;
  }

  Exec* exec_;
  BufferView grads_;
  std::size_t per_bucket_ = 1;
  bool staged_ = false, handed_over_ = false;  // handed_over_: a device reducer (device_)
  bool ipc_ = false;                           // that reducer is device IPC's
  std::vector<std::pair<std::size_t, std::size_t>> ranges_;
  std::vector<std::size_t> ready_;
  // Declaration order is destruction order reversed: handles (which wait for running buckets)
  // go first, then the streams (which wait for their copies), then events and the mirror.
  Tensor mirror_;
  std::vector<ExecEvent<Exec>> ready_events_, copied_events_, back_events_;
  ExecStream<Exec> d2h_, h2d_;
  std::unique_ptr<detail::BucketLauncher> launcher_;
  std::unique_ptr<detail::DeviceBucketReducer> device_;  // handed-over buckets
  detail::DeviceExchange<Exec>* exchange_ = nullptr;     // device_, for sharded steps
  std::vector<CollectiveHandle> handles_;
  std::size_t queued_ = 0;      // buckets whose event is recorded (and copy queued)
  std::size_t started_ = 0;     // buckets whose all-reduce has started
  std::size_t progressed_ = 0;  // handed-over buckets moved on as far as ready() goes
  int rank_ = 0, size_ = 1;
  // Sharded updates: this rank's part of each bucket (first element, count; in bucket order,
  // and ascending for the optimizer's state), and the parameters' all-gathers of the step.
  bool sharded_ = false;
  std::vector<std::pair<std::size_t, std::size_t>> parts_, state_parts_;
  std::vector<CollectiveHandle> gather_handles_;
  std::size_t gathers_started_ = 0;
};

/// Gradient sync of host gradients.
using GradientSync = BasicGradientSync<HostExec>;

}  // namespace dtrain
