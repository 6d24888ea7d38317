// dtrain: gradient averaging in buckets, overlapped with the backward pass.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/collective_handle.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain {

namespace detail {
// Starts bucket i's planned all-reduce; hides the transport type from GradientSync's users.
struct BucketLauncher {
  virtual ~BucketLauncher() = default;
  virtual CollectiveHandle start(std::size_t i) = 0;
};

template <class Transport>
struct PlannedBuckets final : BucketLauncher {
  std::vector<CollectivePlan<Transport>> plans;
  CollectiveHandle start(std::size_t i) override { return plans[i].start(); }
};
}  // namespace detail

/// Averages a gradient arena across the ranks of a communicator, bucket by bucket, while the
/// backward pass is still producing earlier layers' gradients.
///
/// Buckets are contiguous element ranges planned once at construction, starting from the END of
/// the arena (backward produces the last layer's gradients first). ready(offset, count) marks
/// elements final; a bucket whose elements are all final starts its non-blocking all-reduce(avg)
/// at once, on the communicator's progress thread. Buckets always start in the same order (a
/// bucket that completes early waits for the ones before it), so every rank issues the same
/// collectives in the same order. wait() completes every bucket and resets for the next step.
///
/// Local object of one rank, used by one thread (the compute thread); the arena and the
/// communicator are owned by the caller and must outlive it. Every rank must construct it with the
/// same sizes and report the same elements each step.
class GradientSync {
 public:
  /// Local (collective only if `automatic` needs the communicator's cost model measured).
  template <class Transport>
  GradientSync(Communicator<Transport>& comm, BufferView grads, std::size_t bucket_bytes,
               AllreduceAlgorithm algo = AllreduceAlgorithm::automatic)
      : grads_(grads) {
    DTRAIN_REQUIRE(bucket_bytes > 0, "GradientSync", "bucket_bytes must be positive");
    const std::size_t es = size_of(grads.dtype);
    per_bucket_ = bucket_bytes / es > 0 ? bucket_bytes / es : 1;
    const std::size_t n = grads.count;
    const std::size_t nb = n == 0 ? 0 : (n + per_bucket_ - 1) / per_bucket_;
    auto launcher = std::make_unique<detail::PlannedBuckets<Transport>>();
    for (std::size_t i = 0; i < nb; ++i) {
      const std::size_t end = n - i * per_bucket_;
      const std::size_t begin = end > per_bucket_ ? end - per_bucket_ : 0;
      ranges_.emplace_back(begin, end - begin);
      BufferView v = grads.slice(begin, end - begin);
      launcher->plans.push_back(comm.plan_allreduce(v, v, ReduceOp::avg, algo));
    }
    launcher_ = std::move(launcher);
    ready_.assign(nb, 0);
    handles_.resize(nb);
  }

  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  ~GradientSync() = default;  // handles wait for running buckets

  /// Local, non-blocking: elements [offset, offset+count) of the arena are final for this step.
  /// Each element must be reported at most once per step. Starts every bucket that became
  /// complete (in bucket order).
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
    launch_ready();
  }

  /// Local, non-blocking: marks everything not yet reported as final and starts those buckets.
  void ready_all() {
    for (std::size_t b = 0; b < ready_.size(); ++b) ready_[b] = ranges_[b].second;
    launch_ready();
  }

  /// Collective (through the buckets), blocking: completes every bucket, rethrowing the first
  /// failure (bounded by the communicator's deadline), and resets for the next step. Throws
  /// InvalidArgument when some elements were never reported ready.
  void wait() {
    std::exception_ptr first;
    for (std::size_t b = 0; b < started_; ++b) {
      try {
        handles_[b].wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    const std::size_t started = started_;
    started_ = 0;
    std::size_t missing_bucket = ready_.size();
    for (std::size_t b = 0; b < ready_.size(); ++b) {
      if (missing_bucket == ready_.size() && ready_[b] != ranges_[b].second) missing_bucket = b;
      ready_[b] = 0;
    }
    if (first) std::rethrow_exception(first);
    DTRAIN_REQUIRE(started == ready_.size(), "GradientSync::wait",
                   "bucket " << missing_bucket << " [" << ranges_[missing_bucket].first << ", "
                             << ranges_[missing_bucket].first + ranges_[missing_bucket].second
                             << ") was not completely reported ready this step");
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
  /// Buckets started so far this step.
  std::size_t buckets_started() const noexcept { return started_; }
  /// Non-blocking: whether bucket i's all-reduce has completed (false if not started). Rethrows
  /// its failure.
  bool bucket_done(std::size_t i) {
    if (i >= started_) return false;
    return handles_[i].test();
  }

 private:
  std::size_t bucket_of(std::size_t element) const noexcept {
    return (grads_.count - 1 - element) / per_bucket_;
  }

  void launch_ready() {
    while (started_ < ready_.size() && ready_[started_] == ranges_[started_].second) {
      handles_[started_] = launcher_->start(started_);
      ++started_;
    }
  }

  BufferView grads_;
  std::size_t per_bucket_ = 1;
  std::vector<std::pair<std::size_t, std::size_t>> ranges_;
  std::vector<std::size_t> ready_;
  // Declared before the handles so that the handles (which wait for running buckets) go first.
  std::unique_ptr<detail::BucketLauncher> launcher_;
  std::vector<CollectiveHandle> handles_;
  std::size_t started_ = 0;
};

}  // namespace dtrain
