// dtrain: InMemoryDataset, a bounded sample store a running simulation appends to (in-situ
// training).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/transform.hpp>

namespace dtrain {

/// What InMemoryDataset does with a new sample once it holds `capacity` samples.
///   oldest     the new sample overwrites the oldest one (a sliding window over the most recent
///              `capacity` samples; good when the simulation drifts and recent states matter).
///   reservoir  reservoir sampling: the k-th sample ever appended (k >= capacity, 0-based) replaces
///              a uniformly chosen stored one with probability capacity/(k+1) and is dropped
///              otherwise, so the store is always a uniform random subset of everything appended
///              (good against forgetting early states). The choice is driven by Philox(seed), so
///              it is reproducible.
enum class Eviction : unsigned char { oldest, reservoir };

/// Options of InMemoryDataset.
struct InMemoryOptions {
  Eviction eviction = Eviction::oldest;
  /// Seed of the reservoir's random choices.
  std::uint64_t seed = 0;
  /// Labels must lie in [0, num_classes); 0 only requires them to be non-negative.
  int num_classes = 0;
};

/// A rank-local store of up to `capacity` samples (f32 features of a fixed shape plus an i32
/// label), filled by append() while training reads from it. Indices are storage slots
/// [0, size()): a slot keeps its index when its sample is replaced. Each rank holds its own store,
/// so give each rank a sampler over its own slots (world size 1) and the same number of steps on
/// every rank (e.g. construct it with the capacity once the store is full, or the minimum size()
/// over ranks), otherwise a collective in the step waits for the rank that ran out.
/// Thread-safe: append() and read() may run concurrently (a readers-writer lock); a read sees each
/// sample either before or after a concurrent replacement, never a mix.
class InMemoryDataset {
 public:
  InMemoryDataset(Shape sample_shape, std::size_t capacity, InMemoryOptions options = {})
      : shape_(std::move(sample_shape)), capacity_(capacity), opt_(options), rng_(options.seed, 0) {
    DTRAIN_REQUIRE(capacity > 0, "InMemoryDataset", "capacity must be at least 1");
    DTRAIN_REQUIRE(options.num_classes >= 0, "InMemoryDataset",
                   "num_classes " << options.num_classes << " is negative");
    elements_ = element_count(shape_, "InMemoryDataset");
    features_.reserve(capacity_ * elements_);
    labels_.reserve(capacity_);
  }

  /// Appends one sample (`features` holds sample_elements values, copied). Returns the slot it was
  /// stored in, or -1 when the reservoir policy dropped it. Local, blocking only on the lock.
  std::int64_t append(span<const float> features, std::int32_t label) {
    DTRAIN_REQUIRE(features.size() == elements_, "InMemoryDataset::append",
                   "a sample of shape " << to_string(shape_) << " has " << elements_
                                        << " elements, got " << features.size());
    check_label(label);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const std::uint64_t k = appended_++;
    std::size_t slot;
    if (labels_.size() < capacity_) {
      slot = labels_.size();
      labels_.push_back(label);
      features_.insert(features_.end(), features.begin(), features.end());
      return static_cast<std::int64_t>(slot);
    }
    if (opt_.eviction == Eviction::oldest) {
      slot = static_cast<std::size_t>(k % capacity_);
    } else {
      const std::uint64_t j = rng_.below(k + 1);
      if (j >= capacity_) return -1;
      slot = static_cast<std::size_t>(j);
    }
    labels_[slot] = label;
    std::memcpy(features_.data() + slot * elements_, features.data(), elements_ * sizeof(float));
    return static_cast<std::int64_t>(slot);
  }

  /// Appends `labels.size()` samples stored back to back in `features`.
  void append(span<const float> features, span<const std::int32_t> labels) {
    DTRAIN_REQUIRE(features.size() == labels.size() * elements_, "InMemoryDataset::append",
                   labels.size() << " samples need " << labels.size() * elements_
                                 << " feature values, got " << features.size());
    for (std::size_t i = 0; i < labels.size(); ++i)
      append(span<const float>(features.data() + i * elements_, elements_), labels[i]);
  }

  /// Samples currently stored (grows to capacity, then stays).
  std::size_t size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return labels_.size();
  }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Samples ever appended (including replaced and dropped ones).
  std::uint64_t appended() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return appended_;
  }
  Shape sample_shape() const { return shape_; }

  /// Dataset requirement (<dtrain/data/dataset.hpp>). Thread-safe.
  void read(span<const std::int64_t> indices, span<float> features, span<std::int32_t> labels,
            const Normalize& transform) const {
    transform.validate("InMemoryDataset::read");
    std::shared_lock<std::shared_mutex> lock(mutex_);
    detail::check_read_args("InMemoryDataset::read", "in-memory store", labels_.size(), elements_,
                            indices, features, labels);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::size_t s = static_cast<std::size_t>(indices[i]);
      transform.apply(features_.data() + s * elements_, features.data() + i * elements_, elements_);
      labels[i] = labels_[s];
    }
  }

  /// Checkpoint protocol: the stored samples, labels and the eviction state, so an in-situ run
  /// resumes with the same store. Loading requires the same capacity and sample shape.
  template <class V>
  void visit_state(V& v) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    std::int64_t count = static_cast<std::int64_t>(labels_.size());
    std::int64_t appended = static_cast<std::int64_t>(appended_);
    std::int64_t rng_pos = static_cast<std::int64_t>(rng_.position());
    std::int64_t capacity = static_cast<std::int64_t>(capacity_);
    v.scalar("capacity", capacity);
    v.scalar("count", count);
    v.scalar("appended", appended);
    v.scalar("rng_position", rng_pos);
    if (v.loading()) {
      DTRAIN_REQUIRE(
          capacity == static_cast<std::int64_t>(capacity_) && count >= 0 && count <= capacity,
          "InMemoryDataset: restore",
          "checkpoint holds " << count << " of capacity " << capacity
                              << ", this store has capacity " << capacity_);
      labels_.assign(static_cast<std::size_t>(count), 0);
      features_.assign(static_cast<std::size_t>(count) * elements_, 0.0f);
      appended_ = static_cast<std::uint64_t>(appended);
      rng_ = RngStream(opt_.seed, 0);
      rng_.seek(static_cast<std::uint64_t>(rng_pos));
    }
    Shape fshape{count};
    fshape.insert(fshape.end(), shape_.begin(), shape_.end());
    v.tensor("features", BufferView(features_.data(), features_.size(), DType::f32), fshape);
    v.tensor("labels", BufferView(labels_.data(), labels_.size(), DType::i32), Shape{count});
  }

 private:
  void check_label(std::int32_t label) const {
    DTRAIN_REQUIRE(label >= 0 && (opt_.num_classes == 0 || label < opt_.num_classes),
                   "InMemoryDataset::append",
                   "label " << label << " is outside [0, "
                            << (opt_.num_classes ? std::to_string(opt_.num_classes) : "2^31")
                            << ")");
  }

  Shape shape_;
  std::size_t capacity_;
  std::size_t elements_ = 0;
  InMemoryOptions opt_;
  mutable std::shared_mutex mutex_;
  std::vector<float> features_;
  std::vector<std::int32_t> labels_;
  std::uint64_t appended_ = 0;
  RngStream rng_;
};

}  // namespace dtrain
