// SPDX-License-Identifier: BSD-3-Clause
// dtrain: fully sharded training (parameters, gradients and optimizer state each held as 1/p per
// rank). The model's layers are grouped into units; before a unit's forward and again before
// its backward its parameters are all-gathered into a working buffer, and its gradients are
// reduce-scattered into this rank's part as soon as its backward is queued. With two or three
// working buffers the next unit's all-gather runs while the current one computes; with one, a
// rank holds its parts and the working set of one unit only. Device memory goes to a transport
// that takes it as it is (reduced on the device), or is staged through host buffers, as
// GradientSync's buckets.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/comm/collective_handle.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/device_allreduce.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/model/parameter_units.hpp>

namespace dtrain {

/// Options of FullyShardedSync.
struct FullyShardedOptions {
  /// The first layer of each unit (ascending, the first 0). Empty: units by `unit_bytes`.
  std::vector<std::size_t> unit_starts;
  /// 0: each layer with parameters starts a unit (layers without parameters join the unit
  /// before them). Otherwise consecutive layers are joined while a unit's parameters stay within
  /// this many bytes (a larger layer is a unit of its own).
  std::size_t unit_bytes = 0;
  /// Working buffers for whole units' parameters, 1, 2 or 3: the unit computing and 0, 1 or 2
  /// units gathered ahead of it. 1 is the memory-tight mode: one parameter buffer and one
  /// gradient buffer (2 and 3 have two gradient buffers), so a rank holds its parts plus the
  /// largest unit's working set; nothing is gathered ahead of the unit that computes, and a unit's
  /// gradient reduce-scatter finishes before the next unit's backward reuses the gradient buffer.
  int buffers = 2;
  /// Gather the next units while the current one computes (false: each unit when it is needed).
  /// Never across a step's end: a forward gathers its first unit when it starts, so parameters
  /// changed between two passes (the optimizer's update, an average or a clamping of one's own
  /// on model.parameters()) are what every unit of the next pass sees.
  bool prefetch = true;
  /// Greater than 0: wait(optimizer) scales the gradients so that their global L2 norm (over
  /// every rank's parts) is at most this, before the update.
  double max_grad_norm = 0;
};

namespace detail {
// An optimizer that says which parameter arena it updates (the element-wise ones).
template <class O, class = void>
struct has_parameter_arena : std::false_type {};
template <class O>
struct has_parameter_arena<
    O, std::void_t<decltype(BufferView(std::declval<const O&>().parameter_arena()))>>
    : std::true_type {};

// The collectives of a fully sharded model, planned once; hides the transport type.
struct UnitCollectives {
  virtual ~UnitCollectives() = default;
  virtual CollectiveHandle gather(std::size_t unit) = 0;
  virtual CollectiveHandle scatter(std::size_t unit, bool accumulate) = 0;
  // The accumulating reduce-scatters, planned when first needed: (gradient buffer, scratch
  // part) per unit with parameters.
  virtual void plan_accumulating(const std::vector<std::pair<BufferView, BufferView>>& io) = 0;
  virtual double sum(double x) = 0;
};

template <class Transport>
struct PlannedUnits final : UnitCollectives {
  explicit PlannedUnits(Communicator<Transport>& c) : comm(&c) {
    one = Tensor({1}, DType::f64, default_allocator());
  }
  Communicator<Transport>* comm;
  // Per unit (none for a unit without parameters): the all-gather of this rank's part into the
  // unit's working buffer, the reduce-scatter of its gradient buffer into this rank's part, and
  // (once gradients are accumulated over several backward passes) the same into a scratch part.
  std::vector<CollectivePlan<Transport>> gathers, scatters, accumulating;
  std::vector<std::size_t> index;  // unit -> plan index
  Tensor one;
  CollectiveHandle gather(std::size_t u) override { return gathers[index[u]].start(); }
  CollectiveHandle scatter(std::size_t u, bool accumulate) override {
    return accumulate ? accumulating[index[u]].start() : scatters[index[u]].start();
  }
  void plan_accumulating(const std::vector<std::pair<BufferView, BufferView>>& io) override {
    for (const auto& [in, out] : io)
      accumulating.push_back(comm->plan_reduce_scatter(in, out, ReduceOp::avg, false));
  }
  double sum(double x) override {
    *static_cast<double*>(one.raw()) = x;
    comm->allreduce(one.view(), ReduceOp::sum);
    return *static_cast<const double*>(one.raw());
  }
};
}  // namespace detail

/// Fully sharded data parallelism over a Sequential model (BasicSequential<T, Exec>, host or
/// device memory): each rank holds 1/p of every unit's parameters and gradients (the model's arenas
/// become those parts, Sequential::shard_parameters) and an optimizer made from the model
/// afterwards holds the state of those parts only. A unit is a run of consecutive layers
/// (FullyShardedOptions). Before a unit's forward and again before its backward its parameters
/// are all-gathered into one of `buffers` working buffers the size of the largest unit (the
/// last units of a forward are still there for the backward and are not gathered again);
/// during its backward its gradients accumulate into one of two working gradient buffers (one
/// with `buffers` = 1), and the buffer is reduce-scattered (averaged) into this rank's part as
/// soon as the unit's backward is queued, while earlier units compute. With `prefetch` (and 2 or
/// 3 buffers) the next units' all-gathers start while the current unit computes, in forward and
/// in backward; collectives run on the communicator's progress machinery as every non-blocking
/// collective does. On one rank the units are the model's own arenas: nothing is gathered,
/// copied or reduced.
///
/// Device memory (a GPU policy, or a test's emulated device) is handed over or staged, chosen
/// once here and logged (rank 0 at info) with the reason, as GradientSync chooses. Handed over
/// where the transport takes device buffers (device_buffers_of) and the policy reduces the
/// type: each gather sends this rank's device part to every rank and receives theirs into the
/// device working buffer (its own part copied on the device), and each reduce-scatter sends the
/// device gradient buffer's parts to their owners, whose device reduction (rank order, the
/// reduction contract: detail/device_allreduce.hpp) writes the average into the gradient part;
/// the compute stream waits for it on an event. Device receive slots: p-1 parts of the largest
/// unit per gradient buffer (working_bytes); no host memory (handed_over()). Staged otherwise:
/// the collectives run on host buffers (from the policy's host allocator) of the same sizes as the
/// working buffers, plus a host copy of this rank's parameter parts (refreshed at each forward's
/// start and after init or restore) and of its gradient parts. A unit's gathered parameters are
/// copied to its device working buffer on the compute stream before its kernels; after its
/// backward its gradient buffer is copied to the host on the compute stream, reduce-scattered
/// on the host, and the result copied into the device gradient part on the compute stream.
///
/// Device work and collectives are ordered by events, not by synchronising the compute stream:
/// a gather into a working buffer, and a unit's reduce-scatter after its backward, record an
/// event on the compute stream (after the kernels that read the buffer's previous unit, or that
/// write the gradients and their host copy) and start once it has completed, in the order they
/// were queued (the same on every rank). The host checks those events without blocking at each
/// unit and goes on queueing the next unit's kernels; it blocks only where it needs a result: a
/// unit's gathered parameters before its kernels, a gradient buffer before it is reused, wait().
///
/// The step: model.zero_grad(); model.forward_backward(...) (one or several micro-batches);
/// sync.wait(optimizer) (the gradients complete, optionally clipped to a global norm, each part
/// updated); the parameters may then be changed further (an average, a clamping) before the next
/// forward, which gathers them afresh. Every rank ends each step with
/// the parameters the unsharded step gives: the same bits on 2 ranks, and in reproducible mode
/// (rank-order sums in the reduce-scatter as in the all-reduce) on any number, with one backward
/// per step; gradients accumulated over micro-batches are averaged per pass and added, which
/// agrees with the unsharded step to rounding.
///
/// Collective use: every rank constructs it alike and runs the same passes (training and
/// evaluation forwards alike: each gathers) in the same order. Local object of one rank, used
/// by the model's thread; the communicator and the model must outlive it; the model stays
/// sharded after it is gone, its passes refused.
template <class Model>
class FullyShardedSync final : public UnitProvider {
 public:
  using value_type = typename Model::value_type;
  using exec_type = typename Model::exec_type;

  /// Local (plans the collectives). Shards `model` (its parameters must be the same on every
  /// rank, e.g. init with the same seed): frees its whole arenas and keeps this rank's parts. A
  /// model built with `deferred_arenas` has no whole arenas: its parts are made here, zero, and
  /// its init(seed) comes after (the whole parameters and gradients never exist on one rank).
  /// Throws InvalidArgument for bad unit starts or a buffer count other than 1, 2 or 3.
  template <class Transport>
  FullyShardedSync(Communicator<Transport>& comm, Model& model, FullyShardedOptions options = {})
      : model_(&model), exec_(&model.exec()), options_(std::move(options)) {
    using T = value_type;
    constexpr const char* op = "FullyShardedSync";
    DTRAIN_REQUIRE(options_.buffers >= 1 && options_.buffers <= 3, op,
                   "buffers must be 1, 2 or 3, got " << options_.buffers);
    rank_ = comm.rank();
    size_ = comm.size();
    std::vector<std::size_t> counts;
    for (std::size_t i = 0; i < model.layer_count(); ++i)
      counts.push_back(model.layer(i).param_count());
    units_ = plan_parameter_units(counts, options_.unit_starts, options_.unit_bytes / sizeof(T));
    StateParts parts;
    for (const ParameterUnit& u : units_) {
      parts.emplace_back(u.offset + partition_begin(u.count, size_, rank_),
                         partition_count(u.count, size_, rank_));
      largest_ = std::max(largest_, u.count);
      largest_part_ = std::max(largest_part_, parts.back().second);
    }
    model.shard_parameters(units_, parts, *this);
    parts_ = parts;
    std::size_t at = 0;
    for (const auto& part : parts_) {
      starts_.push_back(at);
      at += part.second;
    }
    fresh_.assign(units_.size(), 1);
    reduced_.assign(units_.size(), 0);
    auto planned = std::make_unique<detail::PlannedUnits<Transport>>(comm);
    // One rank holds every unit whole: the layers work in its arenas, as unsharded.
    direct_ = size_ == 1;
    if (direct_) {
      collectives_ = std::move(planned);
      return;
    }
    if (exec_type::space != Space::host) {
      const DeviceBuffers d = device_buffers_of(comm.transport(), exec_type::space);
      handed_over_ = d.handed_over && detail::handover_reduces_on<exec_type>(dtype_of_v<T>);
      staged_ = !handed_over_;
      // Rank 0 tells the run; the others only at debug level.
      const std::string how =
          handed_over_ ? "handed to the transport and reduced on the device (" + d.why + ")"
          : d.handed_over
              ? "staged through host memory (" + detail::handover_refusal(dtype_of_v<T>) + ")"
              : "staged through host memory (" + d.why +
                    "; the communicator's reduce-scatter and all-gather run on host buffers)";
      if (rank_ == 0)
        DTRAIN_LOG(info, "FullyShardedSync: " << name_of(exec_type::space) << " units " << how);
      else
        DTRAIN_LOG(debug, "FullyShardedSync: " << name_of(exec_type::space) << " units " << how);
    }
    Allocator& a = exec_->allocator();
    Allocator& h = exec_->host_allocator();
    const auto big = static_cast<std::int64_t>(std::max<std::size_t>(largest_, 1));
    slots_.resize(static_cast<std::size_t>(options_.buffers));
    for (Slot& s : slots_) {
      s.buffer = Tensor({big}, dtype_of_v<T>, a);
      if (staged_) s.host = Tensor({big}, dtype_of_v<T>, h);
    }
    // Two gradient buffers let a unit's reduce-scatter run while the unit before it computes
    // its backward; one (the memory-tight mode) makes that backward wait for it.
    grad_slots_.resize(options_.buffers == 1 ? 1 : 2);
    for (GradSlot& g : grad_slots_) {
      g.buffer = Tensor({big}, dtype_of_v<T>, a);
      if (staged_) g.host = Tensor({big}, dtype_of_v<T>, h);
    }
    // One event per buffer: a buffer has at most one collective queued behind device work.
    for (Slot& s : slots_) s.ready = ExecEvent<exec_type>(*exec_);
    for (GradSlot& g : grad_slots_) g.ready = ExecEvent<exec_type>(*exec_);
    BufferView params = model.parameters(), grads = model.gradients();
    if (staged_) {
      // The collectives' side of this rank's parts: the gathers send from a host copy of the
      // parameter parts, the reduce-scatters deliver into a host copy of the gradient parts.
      const auto held = static_cast<std::int64_t>(std::max<std::size_t>(at, 1));
      param_mirror_ = Tensor({held}, dtype_of_v<T>, h);
      grad_mirror_ = Tensor({held}, dtype_of_v<T>, h);
      params = param_mirror_.view();
      grads = grad_mirror_.view();
    }
    bool first = true;
    std::vector<detail::DevicePartsOp> ops;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      planned->index.push_back(handed_over_ ? ops.size() : planned->gathers.size());
      const std::size_t c = units_[u].count;
      if (c == 0) continue;
      const std::size_t k = u % slots_.size(), g = u % grad_slots_.size();
      const BufferView part = params.slice(starts_[u], parts_[u].second);
      const BufferView gpart = grads.slice(starts_[u], parts_[u].second);
      if (handed_over_) {
        // The unit's gradient buffer shares its receive slots with the other units of that
        // buffer: their reduce-scatters never overlap.
        ops.push_back({grad_slots_[g].buffer.view().slice(0, c), part,
                       slots_[k].buffer.view().slice(0, c), g});
        continue;
      }
      // The first gather of a pass checks the call fingerprints (a rank out of step); the rest
      // follow it in a fixed order.
      planned->gathers.push_back(comm.plan_allgather(part, slots_[k].wire().slice(0, c), first));
      planned->scatters.push_back(
          comm.plan_reduce_scatter(grad_slots_[g].wire().slice(0, c), gpart, ReduceOp::avg, false));
      first = false;
    }
    if (handed_over_) {
      ops_ = planned->index;
      device_ = std::make_unique<detail::DeviceParts<Transport, exec_type>>(
          comm.transport(), *exec_, std::move(ops), comm.config().timeout_s,
          detail::HandoverNames{"FullyShardedSync hand-over", "unit", "reduce-scatter",
                                "all-gather"});
    }
    collectives_ = std::move(planned);
  }

  FullyShardedSync(const FullyShardedSync&) = delete;
  FullyShardedSync& operator=(const FullyShardedSync&) = delete;
  /// Waits for its running collectives; the model keeps its parts and refuses passes.
  ~FullyShardedSync() override {
    model_->detach_provider(this);
    // Collectives queued behind device work start (every rank queued them alike), unless an
    // error is unwinding: a destructor then runs no collective.
    if (std::uncaught_exceptions() == 0) {
      try {
        start_through(deferred_.size());
      } catch (...) {  // a destructor never throws; the error was the step's to report
      }
    }
    deferred_.clear();
    for (Slot& s : slots_) finish_quietly(s.pending);
    for (GradSlot& g : grad_slots_) finish_quietly(g.pending);
    // Handed over: transfers complete, or abandoned while an error unwinds (the engine cancels
    // what is still posted when it goes).
    if (device_ && std::uncaught_exceptions() == 0) {
      for (Slot& s : slots_) {
        try {
          complete(s);
        } catch (...) {  // a destructor never throws; the error was the step's to report
        }
      }
      for (GradSlot& g : grad_slots_) {
        try {
          complete_scatter(g, g.unit);
        } catch (...) {
        }
      }
    }
    // Copies queued on the compute stream may still read or write the buffers freed next.
    try {
      exec_->synchronize(exec_->compute_stream(), Deadline(exec_timeout_s()));
    } catch (...) {  // a device error was already reported to the waits that saw it
    }
  }

  // ---- UnitProvider (called by the model) --------------------------------------------------

  void* acquire(std::size_t u, bool backward) override {
    // A new forward: what earlier passes left in the buffers may predate a change of the
    // parameters (an update, or the caller's own edit of its parts).
    if (!backward && u == 0) invalidate();
    if (units_[u].count == 0) return nullptr;
    if (direct_) return static_cast<value_type*>(model_->parameters().data) + starts_[u];
    Slot& s = slot_of(u);
    if (s.unit != u) start_gather(u);
    start_through(queued_at(&s));
    complete(s);
    if (staged_ && !s.uploaded) {
      // The gathered unit, to the device buffer ahead of the unit's kernels (stream order).
      exec_->copy_h2d(exec_->compute_stream(), s.buffer.raw(), s.host.raw(),
                      units_[u].count * sizeof(value_type));
      s.uploaded = true;
    }
    if (options_.prefetch)
      for (int d = 1; d < options_.buffers; ++d) {
        const std::size_t v = backward ? u - static_cast<std::size_t>(d) : u + d;
        if (backward ? u < static_cast<std::size_t>(d) : v >= units_.size()) break;
        if (units_[v].count && slot_of(v).unit != v) start_gather(v);
      }
    start_ready();
    return s.buffer.raw();
  }
  void forward_done(std::size_t) override { start_ready(); }
  void* gradient_buffer(std::size_t u) override {
    using T = value_type;
    const std::size_t c = units_[u].count;
    if (c == 0) return nullptr;
    // One rank: the backward accumulates into the arena itself, as unsharded.
    if (direct_) return static_cast<T*>(model_->gradients().data) + starts_[u];
    GradSlot& g = grad_slots_[u % grad_slots_.size()];
    finish_scatter(g);
    exec_->fill(exec_->compute_stream(), static_cast<T*>(g.buffer.raw()), c, T(0));
    return g.buffer.raw();
  }
  void backward_done(std::size_t u) override {
    if (units_[u].count == 0 || direct_) {
      reduced_[u] = 1;
      return;
    }
    GradSlot& g = grad_slots_[u % grad_slots_.size()];
    if (staged_)
      exec_->copy_d2h(exec_->compute_stream(), g.host.raw(), g.buffer.raw(),
                      units_[u].count * sizeof(value_type));
    const bool accumulate = !fresh_[u];
    if (accumulate) make_scratch();
    g.unit = u;
    g.accumulate = accumulate;
    // The progress thread reads the gradients (or their host copy) once the kernels that write
    // them have run: the reduce-scatter waits for an event, the host goes on queueing.
    queue_behind_device(false, u, &g);
    fresh_[u] = 0;
    reduced_[u] = 1;
    traffic_ += units_[u].count;
  }
  void gradients_zeroed() override {
    start_ready();
    for (GradSlot& g : grad_slots_) finish_scatter(g);
    std::fill(fresh_.begin(), fresh_.end(), 1);
  }
  void parameters_changed() override { invalidate(); }

  // ---- the step ------------------------------------------------------------------------------

  /// Collective, blocking: completes the gradients' reduce-scatters (this rank's parts of the
  /// model's gradients() now hold the average over the ranks). Throws InvalidArgument when no
  /// backward ran since the last step. The whole units gathered before it are not reused by the
  /// next forward (the caller may change the parameters: clip_grad_norm, an optimizer step).
  void wait() {
    std::exception_ptr first;
    for (GradSlot& g : grad_slots_) {
      try {
        finish_scatter(g);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    // Nothing stays queued past the step: collectives outside this sync (the user's, the
    // norm's) then start after these on every rank.
    try {
      start_through(deferred_.size());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    const bool any = std::any_of(reduced_.begin(), reduced_.end(), [](char r) { return r != 0; });
    const bool all = std::all_of(reduced_.begin(), reduced_.end(), [](char r) { return r != 0; });
    std::fill(reduced_.begin(), reduced_.end(), 0);
    if (first) std::rethrow_exception(first);
    DTRAIN_REQUIRE(any && all, "FullyShardedSync::wait",
                   (any ? "a backward pass did not reach every unit"
                        : "no backward pass since the last step"));
  }

  /// wait(), then (with FullyShardedOptions::max_grad_norm) the global-norm clipping, then
  /// `opt`'s update of this rank's part of each unit and its complete_step(). Nothing is
  /// gathered for the next forward here: the parameters may still change before it (see
  /// FullyShardedOptions::prefetch). `opt` is anything with update(offset, count) in whole-arena
  /// offsets and complete_step(), such as an Sgd or AdamW made from the model (before or after
  /// the sync: one made before follows the model to its parts). Collective, blocking. Throws
  /// InvalidArgument, before any update, for an optimizer whose parameter_arena() is not the
  /// model's parts (one made from the model's views before they were freed).
  template <class Optimizer>
  void wait(Optimizer& opt) {
    if constexpr (detail::has_parameter_arena<Optimizer>::value) {
      const BufferView mine = model_->parameters(), theirs = opt.parameter_arena();
      DTRAIN_REQUIRE(
          theirs.data == mine.data && theirs.count == mine.count, "FullyShardedSync::wait",
          "the optimizer updates an arena of "
              << theirs.count << " elements that is not the sharded model's parts (" << mine.count
              << " elements): made from the model's views before the sync freed "
                 "them? Make it from the model itself (e.g. AdamW opt(model, lr))");
    }
    wait();
    if (options_.max_grad_norm > 0) clip_grad_norm(options_.max_grad_norm);
    for (const auto& [first, count] : parts_)
      if (count) opt.update(first, count);
    opt.complete_step();
  }

  /// Collective, blocking, after wait(): scales this rank's parts of the gradients so that the
  /// global L2 norm over every rank's parts is at most `max_norm`, and returns the norm before
  /// (sum of squares in double, summed over the ranks: in reproducible mode in rank order).
  /// Agrees with clip_grad_norm on the whole gradients to rounding. A non-finite norm is
  /// returned unchanged and nothing is scaled.
  double clip_grad_norm(double max_norm) {
    using T = value_type;
    DTRAIN_REQUIRE(max_norm > 0, "FullyShardedSync::clip_grad_norm",
                   "max_norm must be positive, got " << max_norm);
    const BufferView g = model_->gradients();
    double local = 0;
    if (g.count) {
      // The sum lands in exec memory and comes back through a host slot (a device's kernels
      // cannot write host memory); both made at the first clipping.
      if (!norm_exec_.size()) {
        norm_exec_ = Tensor({1}, DType::f64, exec_->allocator());
        norm_host_ = Tensor({1}, DType::f64, exec_->host_allocator());
      }
      const auto s = exec_->compute_stream();
      exec_->sum_squares(s, static_cast<const T*>(g.data), g.count,
                         static_cast<double*>(norm_exec_.raw()));
      exec_->copy_d2h(s, norm_host_.raw(), norm_exec_.raw(), sizeof(double));
      exec_synchronize(*exec_, s, exec_timeout_s(), "FullyShardedSync::clip_grad_norm");
      local = *static_cast<const double*>(norm_host_.raw());
    }
    const double norm = std::sqrt(collectives_->sum(local));
    last_norm_ = norm;
    if (std::isfinite(norm) && norm > max_norm && g.count)
      exec_->scale(exec_->compute_stream(), static_cast<T*>(g.data), g.count,
                   static_cast<T>(max_norm / (norm + 1e-6)));
    return norm;
  }
  /// The norm the last clipping saw (0 before any).
  double last_grad_norm() const noexcept { return last_norm_; }

  // ---- layout and memory ---------------------------------------------------------------------

  std::size_t unit_count() const noexcept { return units_.size(); }
  const ParameterUnit& unit(std::size_t i) const { return units_.at(i); }
  /// This rank's part of unit i: (first element of the whole arena, count).
  std::pair<std::size_t, std::size_t> part(std::size_t i) const { return parts_.at(i); }
  /// Elements of the largest unit (the size of every working buffer).
  std::size_t largest_unit() const noexcept { return largest_; }
  /// Elements of this rank's parts together (of each of parameters, gradients, optimizer state).
  std::size_t held_elements() const noexcept { return model_->parameters().count; }
  /// Bytes of the working buffers (exec memory): `buffers` for parameters and two for gradients
  /// (one with `buffers` = 1), each of the largest unit, and, once gradients were accumulated
  /// over several backward passes, a scratch part per gradient buffer (none on one rank, where
  /// the layers work in the model's arenas); handed over, also the reduce-scatters' receive
  /// slots.
  std::size_t working_bytes() const noexcept {
    std::size_t b = device_ ? device_->scratch_bytes() : 0;
    for (const Slot& s : slots_) b += s.buffer.bytes();
    for (const GradSlot& g : grad_slots_) b += g.buffer.bytes() + g.scratch.bytes();
    return b;
  }
  /// Bytes of the host staging of device memory (0 unless staged()): a host twin of every
  /// working buffer and of the scratch parts, and host copies of this rank's parameter and
  /// gradient parts.
  std::size_t staging_bytes() const noexcept {
    std::size_t b = param_mirror_.bytes() + grad_mirror_.bytes();
    for (const Slot& s : slots_) b += s.host.bytes();
    for (const GradSlot& g : grad_slots_) b += g.host.bytes() + g.scratch_host.bytes();
    return b;
  }
  /// Whether the collectives run on host copies of device memory, or device memory is handed
  /// to the transport as it is (see the class comment); both false for host memory and on one
  /// rank.
  bool staged() const noexcept { return staged_; }
  bool handed_over() const noexcept { return handed_over_; }
  /// Elements all-gathered and reduce-scattered so far (whole units; each rank sends and
  /// receives (p-1)/p of them): against an all-reduce's 2 per element and step, 3 when each
  /// unit is gathered twice.
  std::uint64_t elements_moved() const noexcept { return traffic_; }
  /// All-gathers started so far.
  std::uint64_t gathers() const noexcept { return gathers_; }

 private:
  // A working buffer (exec memory) and, when staged, its host twin that the collective uses.
  struct Slot {
    Tensor buffer, host;
    std::size_t unit = npos;
    bool uploaded = false;  // staged: the gathered unit was copied to the buffer
    CollectiveHandle pending;
    bool moving = false;         // handed over: its all-gather is posted
    ExecEvent<exec_type> ready;  // recorded when its gather was queued behind device work
    BufferView wire() const { return host.size() ? host.view() : buffer.view(); }
  };
  struct GradSlot {
    Tensor buffer, host, scratch, scratch_host;
    std::size_t unit = npos;
    bool accumulate = false;
    CollectiveHandle pending;
    bool moving = false;         // handed over: its reduce-scatter is posted
    ExecEvent<exec_type> ready;  // recorded when its reduce-scatter was queued
    BufferView wire() const { return host.size() ? host.view() : buffer.view(); }
    BufferView scratch_wire() const {
      return scratch_host.size() ? scratch_host.view() : scratch.view();
    }
  };
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  Slot& slot_of(std::size_t u) { return slots_[u % slots_.size()]; }

  // The scratch parts and the accumulating reduce-scatters, made at the first accumulation (every
  // rank at the same backward_done).
  void make_scratch() {
    if (scratch_made_) return;
    Allocator& a = exec_->allocator();
    const auto small = static_cast<std::int64_t>(std::max<std::size_t>(largest_part_, 1));
    for (GradSlot& g : grad_slots_) {
      g.scratch = Tensor({small}, dtype_of_v<value_type>, a);
      if (staged_)
        g.scratch_host = Tensor({small}, dtype_of_v<value_type>, exec_->host_allocator());
    }
    scratch_made_ = true;
    if (handed_over_) return;  // the device reduction writes into the scratch part itself
    std::vector<std::pair<BufferView, BufferView>> io;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].count == 0) continue;
      GradSlot& g = grad_slots_[u % grad_slots_.size()];
      io.emplace_back(g.wire().slice(0, units_[u].count),
                      g.scratch_wire().slice(0, parts_[u].second));
    }
    collectives_->plan_accumulating(io);
  }

  void start_gather(std::size_t u) {
    Slot& s = slot_of(u);
    start_through(queued_at(&s));
    complete(s);
    s.unit = u;
    s.uploaded = false;
    // The buffer's previous unit is read by kernels queued before now: the gather waits for
    // them on an event.
    queue_behind_device(true, u, &s);
    traffic_ += units_[u].count;
    ++gathers_;
  }

  // ---- collectives queued behind device work (see the class comment) -------------------------

  // A collective that starts once the event of its buffer has completed. FIFO: every rank
  // queues the same collectives in the same order and starts them in that order.
  struct Queued {
    bool gather;
    std::size_t unit;
    void* buffer;  // its Slot or GradSlot
  };
  void queue_behind_device(bool gather, std::size_t u, void* buffer) {
    auto& ev = gather ? static_cast<Slot*>(buffer)->ready : static_cast<GradSlot*>(buffer)->ready;
    exec_->record(ev.get(), exec_->compute_stream());
    deferred_.push_back(Queued{gather, u, buffer});
    start_ready();
  }
  // How many queued collectives must start for the one on `buffer` to have started (0: none
  // queued on it).
  std::size_t queued_at(const void* buffer) const {
    for (std::size_t i = deferred_.size(); i-- > 0;)
      if (deferred_[i].buffer == buffer) return i + 1;
    return 0;
  }
  void start_front() {
    const Queued q = deferred_.front();
    deferred_.pop_front();
    if (handed_over_) {
      const std::size_t i = op_of(q.unit);
      if (q.gather) {
        device_->start_gather(i);
        static_cast<Slot*>(q.buffer)->moving = true;
      } else {
        auto* g = static_cast<GradSlot*>(q.buffer);
        const BufferView out =
            g->accumulate ? g->scratch.view().slice(0, parts_[q.unit].second)
                          : model_->gradients().slice(starts_[q.unit], parts_[q.unit].second);
        device_->start_scatter(i, out);
        g->moving = true;
      }
      return;
    }
    if (q.gather)
      static_cast<Slot*>(q.buffer)->pending = collectives_->gather(q.unit);
    else
      static_cast<GradSlot*>(q.buffer)->pending =
          collectives_->scatter(q.unit, static_cast<GradSlot*>(q.buffer)->accumulate);
  }
  typename exec_type::event_type event_of(const Queued& q) const {
    return q.gather ? static_cast<Slot*>(q.buffer)->ready.get()
                    : static_cast<GradSlot*>(q.buffer)->ready.get();
  }
  // Starts the queued collectives whose device work has completed, without blocking.
  void start_ready() {
    while (!deferred_.empty() && exec_->query(event_of(deferred_.front()))) start_front();
  }
  // Starts the first n queued collectives, waiting for their device work (a host wait on an
  // event, bounded like every device wait).
  void start_through(std::size_t n) {
    for (; n > 0 && !deferred_.empty(); --n) {
      exec_wait(*exec_, event_of(deferred_.front()), exec_timeout_s(),
                "FullyShardedSync (device work before a collective)");
      start_front();
    }
  }

  void invalidate() {
    start_through(deferred_.size());
    std::exception_ptr first;
    for (Slot& s : slots_) {
      try {
        complete(s);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      s.unit = npos;
    }
    if (first) std::rethrow_exception(first);
    if (staged_ && !parts_.empty()) {
      // The gathers send the host copy of the parts: brought up to date with the device's.
      const BufferView p = model_->parameters();
      if (p.count) {
        exec_->copy_d2h(exec_->compute_stream(), param_mirror_.raw(), p.data, p.bytes());
        exec_synchronize(*exec_, exec_->compute_stream(), exec_timeout_s(),
                         "FullyShardedSync (the parameter parts to the host)");
      }
    }
  }
  // Completes the slot's reduce-scatter; an accumulating one is added into this rank's part.
  void finish_scatter(GradSlot& g) {
    start_through(queued_at(&g));
    if (!g.pending.valid() && !g.moving) return;
    const std::size_t u = g.unit;
    g.unit = npos;
    complete_scatter(g, u);
    const BufferView grads = model_->gradients();
    const std::size_t n = parts_[u].second;
    const auto s = exec_->compute_stream();
    if (!g.accumulate) {
      // Staged: the averaged part, from its host copy into the device gradients.
      if (staged_ && n)
        exec_->copy_h2d(s, static_cast<value_type*>(grads.data) + starts_[u],
                        static_cast<const value_type*>(grad_mirror_.raw()) + starts_[u],
                        n * sizeof(value_type));
      return;
    }
    if (staged_ && n)
      exec_->copy_h2d(s, g.scratch.raw(), g.scratch_host.raw(), n * sizeof(value_type));
    exec_->reduce_into(s, ReduceOp::sum, grads.slice(starts_[u], n), g.scratch.view().slice(0, n));
  }
  // The operation of unit u in the hand-over.
  std::size_t op_of(std::size_t u) const { return ops_[u]; }
  // Completes the slot's all-gather: handed over, later work on the compute stream sees it.
  void complete(Slot& s) {
    if (s.moving) {
      s.moving = false;
      device_->finish_gather(op_of(s.unit), exec_->compute_stream());
    }
    if (s.pending.valid()) s.pending.wait();
  }
  // Completes the gradient buffer's reduce-scatter of unit u: handed over, its reduction is
  // queued and the compute stream waits for it.
  void complete_scatter(GradSlot& g, std::size_t u) {
    if (g.moving) {
      g.moving = false;
      const std::size_t i = op_of(u);
      device_->finish_scatter(i);
      exec_->stream_wait(exec_->compute_stream(), device_->reduced_event(i));
    }
    if (g.pending.valid()) g.pending.wait();
  }
  static void finish_quietly(CollectiveHandle& h) noexcept {
    try {
      h.wait();
    } catch (...) {  // a destructor never throws; the error was the step's to report
    }
  }

  Model* model_;
  exec_type* exec_;
  FullyShardedOptions options_;
  int rank_ = 0, size_ = 1;
  std::vector<ParameterUnit> units_;
  StateParts parts_;
  std::vector<std::size_t> starts_;  // where each part starts in the model's arenas
  std::size_t largest_ = 0, largest_part_ = 0;
  // Declaration order is destruction order reversed: the handles inside the slots wait for
  // their collectives before the plans go.
  std::unique_ptr<detail::UnitCollectives> collectives_;
  std::vector<Slot> slots_;
  std::vector<GradSlot> grad_slots_;  // 2, or 1 with buffers = 1
  // Handed over: the units' reduce-scatters and all-gathers (gone before the buffers they use).
  std::unique_ptr<detail::DeviceExchange<exec_type>> device_;
  std::vector<std::size_t> ops_;       // unit -> its operation in device_
  std::deque<Queued> deferred_;        // collectives waiting for device work, in start order
  std::vector<char> fresh_;            // unit's part untouched since zero_grad
  std::vector<char> reduced_;          // unit's gradients reduced since the last wait
  bool direct_ = false;                // one rank: the units are the model's own arenas
  bool scratch_made_ = false;          // make_scratch
  bool staged_ = false;                // device memory through host copies (see the class comment)
  bool handed_over_ = false;           // device memory handed to the transport
  Tensor param_mirror_, grad_mirror_;  // staged: host copies of this rank's parts
  Tensor norm_exec_, norm_host_;       // clip_grad_norm's sum of squares and its host copy
  double last_norm_ = 0;
  std::uint64_t traffic_ = 0, gathers_ = 0;
};

}  // namespace dtrain
