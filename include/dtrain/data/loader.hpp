// SPDX-License-Identifier: BSD-3-Clause
// dtrain: Loader, batches for the training loop, filled ahead of time by a background thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/batch.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/transform.hpp>

namespace dtrain {

/// Options of Loader.
struct LoaderOptions {
  /// Batches read ahead by the background thread (1 = double buffering: one in use, one being
  /// read). The thread refills once half of them are consumed, several per wake-up. 0 reads each
  /// batch in the caller's thread inside next() (no thread; for datasets that must not be read
  /// concurrently with the caller, e.g. MPI-IO without MPI_THREAD_MULTIPLE). Memory: this many
  /// batches plus the caller's. When every core already runs a rank, each wake-up of the reader
  /// waits for the scheduler; a deeper read-ahead (8) refills more batches per wake-up.
  std::size_t prefetch_depth = 4;
  /// Applied to every feature while the batch is filled.
  Normalize transform{};
  /// Deliver features as [B, elements] instead of [B, ...sample shape] (same memory).
  bool flatten = false;
  /// Longest wait in next() for a batch that is not ready; then TimeoutError. Negative: forever.
  double timeout_s = 300.0;
};

/// Iterates the sampler's current epoch from its current position, one batch per next().
/// Each call hands over a batch and advances the sampler by it, so the sampler (and a checkpoint
/// of it) always describes what the training loop has consumed, never what was read ahead. When
/// the sampler is changed from outside (set_epoch, restore, set_position), the read-ahead is
/// discarded and the next call continues from the sampler's new state. After the epoch's last
/// batch next() returns false until the sampler moves on (typically set_epoch(e + 1)).
///
/// Local (no communication of its own); all ranks get the same number of batches. One caller
/// thread at a time; the dataset and the sampler must outlive the loader. The background thread
/// calls only dataset.read(); its errors are rethrown by the next() that would have returned the
/// failed batch. The destructor stops the thread after the read in progress (mid-epoch is fine).
/// A dataset whose reads are collective (reads_collectively()) is read in the caller's thread.
template <class Dataset>
class Loader {
  static_assert(dataset_has_size_v<Dataset>,
                "Loader: the dataset needs `std::size_t size() const`");
  static_assert(dataset_has_sample_shape_v<Dataset>,
                "Loader: the dataset needs `Shape sample_shape() const`");
  static_assert(dataset_has_read_v<Dataset>,
                "Loader: the dataset needs `read(span<const std::int64_t>, span<float>, "
                "span<std::int32_t>, const Normalize&)`");

 public:
  Loader(Dataset& dataset, DistributedSampler& sampler, std::size_t batch_size,
         LoaderOptions options = {})
      : dataset_(dataset), sampler_(sampler), batch_(batch_size), opt_(std::move(options)) {
    DTRAIN_REQUIRE(batch_size >= 1, "Loader", "batch size must be at least 1");
    opt_.transform.validate("Loader");
    DTRAIN_REQUIRE(sampler.num_samples() <= dataset.size(), "Loader",
                   "the sampler draws from " << sampler.num_samples()
                                             << " samples but the dataset holds "
                                             << dataset.size());
    sample_shape_ = dataset.sample_shape();
    elements_ = element_count(sample_shape_, "Loader");
    if (opt_.prefetch_depth > 0 && reads_collectively(dataset)) {
      // A background thread could have issued a different number of collective reads on each
      // rank when the loop stops or the sampler jumps, leaving the others waiting forever.
      DTRAIN_LOG(debug, "Loader: the dataset reads collectively; reading in the caller's thread");
      opt_.prefetch_depth = 0;
    }
    if (opt_.prefetch_depth > 0) {
      slots_.resize(opt_.prefetch_depth);
      worker_ = std::thread([this] { work(); });
    }
  }

  ~Loader() {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      work_cv_.notify_all();
      worker_.join();
    }
  }

  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Hands over the next batch of the epoch into `out` (swapping buffers, so `out`'s old tensors
  /// are reused for a later batch) and advances the sampler. Returns false at the epoch's end.
  /// Blocking up to timeout_s; rethrows an error of the background read of this batch.
  bool next(Batch& out) {
    const Timer waited;
    const bool got = opt_.prefetch_depth == 0 ? next_sync(out) : next_async(out);
    wait_seconds_ += waited.seconds();
    if (got) {
      sampler_.advance(batch_);
      expected_position_ = sampler_.position();
      ++delivered_;
    }
    return got;
  }

  /// Starts reading ahead from the sampler's current state before the first next() (optional).
  void prefetch() {
    if (opt_.prefetch_depth == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pass_matches_sampler()) start_pass_locked();
  }

  std::size_t batch_size() const noexcept { return batch_; }
  /// Batches this loader will still hand over in the current epoch.
  std::size_t remaining_batches() const { return sampler_.remaining_batches(batch_); }
  /// Seconds the caller spent inside next() (waiting for data: the loader's share of step time).
  double wait_seconds() const noexcept { return wait_seconds_; }
  /// Seconds spent filling batches (reading and transforming), on whichever thread did it: the
  /// loader's own cost, which the read-ahead hides when a core is free for it. Thread-safe.
  double read_seconds() const noexcept { return static_cast<double>(read_ns_.load()) * 1e-9; }
  /// Batches handed over since construction.
  std::size_t delivered() const noexcept { return delivered_; }

  /// Input iterator over the rest of the epoch; the batch it refers to lives in the loader and is
  /// overwritten by the next increment.
  class iterator {
   public:
    using value_type = Batch;
    using reference = Batch&;
    iterator() = default;
    Batch& operator*() const { return loader_->current_; }
    Batch* operator->() const { return &loader_->current_; }
    iterator& operator++() {
      if (!loader_->next(loader_->current_)) loader_ = nullptr;
      return *this;
    }
    bool operator==(const iterator& o) const { return loader_ == o.loader_; }
    bool operator!=(const iterator& o) const { return loader_ != o.loader_; }

   private:
    friend class Loader;
    explicit iterator(Loader* l) : loader_(l) {}
    Loader* loader_ = nullptr;
  };
  iterator begin() {
    iterator it(this);
    if (!next(current_)) it.loader_ = nullptr;
    return it;
  }
  iterator end() { return iterator(); }

 private:
  enum class SlotState : unsigned char { free, filling, ready };
  struct Slot {
    Batch batch;
    SlotState state = SlotState::free;
    std::uint64_t pass = 0;
    std::exception_ptr error;
  };
  // What a pass reads: a private copy of the sampler as it was when the pass started.
  struct Plan {
    DistributedSampler sampler;
    std::uint64_t start;
    std::size_t batches;
  };

  // Fills `b` with batch j of `plan`. Runs on the worker (or the caller for depth 0).
  void fill(Batch& b, const Plan& plan, std::size_t j) {
    const Timer timer;
    struct Account {
      const Timer& t;
      std::atomic<std::int64_t>& total;
      ~Account() { total += static_cast<std::int64_t>(t.seconds() * 1e9); }
    } account{timer, read_ns_};
    std::uint64_t g = plan.start;
    // Positions advance by batch_*W until the last batch, so batch j starts at start + j*B*W.
    g += static_cast<std::uint64_t>(j) * batch_ *
         static_cast<std::uint64_t>(plan.sampler.world_size());
    plan.sampler.indices_at(g, batch_, b.indices);
    const std::size_t rows = b.indices.size();
    Shape fshape{static_cast<std::int64_t>(rows)};
    if (opt_.flatten)
      fshape.push_back(static_cast<std::int64_t>(elements_));
    else
      fshape.insert(fshape.end(), sample_shape_.begin(), sample_shape_.end());
    if (b.features.dtype() != DType::f32 || b.features.shape() != fshape)
      b.features = Tensor(fshape, DType::f32);
    if (b.labels.dtype() != DType::i32 ||
        b.labels.shape() != Shape{static_cast<std::int64_t>(rows)})
      b.labels = Tensor(Shape{static_cast<std::int64_t>(rows)}, DType::i32);
    dataset_.read(span<const std::int64_t>(b.indices.data(), rows), b.features.template as<float>(),
                  b.labels.template as<std::int32_t>(), opt_.transform);
    b.size = rows;
    b.epoch = plan.sampler.epoch();
    b.number = j;
  }

  bool pass_matches_sampler() const {
    return plan_ && sampler_.generation() == plan_generation_ &&
           sampler_.position() == expected_position_;
  }

  bool next_sync(Batch& out) {
    if (!pass_matches_sampler()) start_plan();
    if (next_deliver_ >= plan_->batches) return false;
    try {
      fill(out, *plan_, next_deliver_);
    } catch (...) {
      plan_.reset();  // the next call retries this batch from the sampler's position
      throw;
    }
    ++next_deliver_;
    return true;
  }

  void start_plan() {
    plan_ = std::make_shared<const Plan>(
        Plan{sampler_, sampler_.position(), sampler_.remaining_batches(batch_)});
    plan_generation_ = sampler_.generation();
    expected_position_ = sampler_.position();
    next_deliver_ = 0;
  }

  std::size_t low_water() const noexcept { return slots_.size() / 2; }

  // Discards the read-ahead and starts a pass from the sampler's state. Caller holds mutex_.
  void start_pass_locked() {
    start_plan();
    ++pass_;
    next_fill_ = 0;
    for (auto& s : slots_)
      if (s.state == SlotState::ready)
        s.state = SlotState::free;  // a filling slot is freed by the worker
    work_cv_.notify_all();
  }

  bool next_async(Batch& out) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!pass_matches_sampler()) start_pass_locked();
    if (next_deliver_ >= plan_->batches) return false;
    const std::size_t j = next_deliver_;
    Slot& slot = slots_[j % slots_.size()];
    const Deadline deadline(opt_.timeout_s);
    auto ready = [&] { return slot.state == SlotState::ready && slot.pass == pass_; };
    while (!ready()) {
      if (opt_.timeout_s < 0) {
        ready_cv_.wait(lock);
      } else if (ready_cv_.wait_for(
                     lock, std::chrono::duration<double>(std::max(0.0, deadline.remaining()))) ==
                     std::cv_status::timeout &&
                 !ready() && deadline.expired()) {
        raise<TimeoutError>("Loader::next",
                            "batch " + std::to_string(j) + " of epoch " +
                                std::to_string(plan_->sampler.epoch()) + " not ready after " +
                                std::to_string(opt_.timeout_s) +
                                " s (the background thread is still reading the dataset)");
      }
    }
    ++next_deliver_;
    slot.state = SlotState::free;
    // Wake the reader only at the low-water mark, so that it refills several slots per wake-up:
    // on a node where every core runs a rank, each wake-up waits for the scheduler.
    if (next_fill_ <= next_deliver_ + low_water()) work_cv_.notify_one();
    if (slot.error) {
      std::exception_ptr e = std::move(slot.error);
      slot.error = nullptr;
      plan_.reset();  // the next call retries from the sampler's (unchanged) position
      std::rethrow_exception(e);
    }
    std::swap(out, slot.batch);
    return true;
  }

  void work() {
    detail::RankScope rank_scope(sampler_.rank());
    std::unique_lock<std::mutex> lock(mutex_);
    bool streak = false;  // keep filling until the ring is full, then sleep to the low-water mark
    auto can_fill = [&] {
      return plan_ && next_fill_ < plan_->batches &&
             slots_[next_fill_ % slots_.size()].state == SlotState::free &&
             next_fill_ < next_deliver_ + slots_.size();
    };
    for (;;) {
      work_cv_.wait(lock, [&] {
        return stop_ || (can_fill() && (streak || next_fill_ <= next_deliver_ + low_water()));
      });
      if (stop_) return;
      const std::size_t j = next_fill_++;
      Slot& slot = slots_[j % slots_.size()];
      slot.state = SlotState::filling;
      slot.pass = pass_;
      slot.error = nullptr;
      std::shared_ptr<const Plan> plan = plan_;
      const std::uint64_t pass = pass_;
      lock.unlock();
      std::exception_ptr error;
      try {
        fill(slot.batch, *plan, j);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (pass != pass_) {
        slot.state = SlotState::free;  // the pass was abandoned while this batch was read
      } else {
        slot.error = error;
        slot.state = SlotState::ready;
        // After a failure, read no further: the caller will see the error and restart.
        if (error) next_fill_ = plan_->batches;
      }
      streak = can_fill();
      ready_cv_.notify_one();
    }
  }

  Dataset& dataset_;
  DistributedSampler& sampler_;
  std::size_t batch_;
  LoaderOptions opt_;
  Shape sample_shape_;
  std::size_t elements_ = 0;

  // Caller-side state (plan_ is also read by the worker under mutex_).
  std::shared_ptr<const Plan> plan_;
  std::uint64_t plan_generation_ = 0;
  std::uint64_t expected_position_ = 0;
  std::size_t next_deliver_ = 0;
  Batch current_;
  double wait_seconds_ = 0.0;
  std::atomic<std::int64_t> read_ns_{0};
  std::size_t delivered_ = 0;

  // Shared with the worker, guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable work_cv_;   // the reader waits here
  std::condition_variable ready_cv_;  // the caller waits here
  std::vector<Slot> slots_;
  std::uint64_t pass_ = 0;
  std::size_t next_fill_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

template <class Dataset>
Loader(Dataset&, DistributedSampler&, std::size_t, LoaderOptions) -> Loader<Dataset>;
template <class Dataset>
Loader(Dataset&, DistributedSampler&, std::size_t) -> Loader<Dataset>;

}  // namespace dtrain
