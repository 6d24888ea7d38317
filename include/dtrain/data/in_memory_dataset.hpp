// SPDX-License-Identifier: BSD-3-Clause
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

/// A rank-local store of up to `capacity` samples, filled while training reads from it. It holds
/// either labelled samples (f32 features of a fixed shape plus an i32 label: append(), read(), and
/// so a Loader) or regression pairs (an f32 input and an f32 target of fixed shapes, no label:
/// append_pair(), read_pairs()), as its constructor says. Indices are storage slots [0, size()): a
/// slot keeps its index when its sample is replaced. Each rank holds its own store, so give each
/// rank a sampler over its own slots (world size 1) and the same number of steps on every rank
/// (e.g. construct it with the capacity once the store is full, or the minimum size() over ranks),
/// otherwise a collective in the step waits for the rank that ran out.
/// Thread-safe: appends and reads may run concurrently (a readers-writer lock); a read sees each
/// sample either before or after a concurrent replacement, never a mix. The store owns copies of
/// what is appended; reads copy into the caller's buffers.
class InMemoryDataset {
 public:
  /// A store of labelled samples: features of `sample_shape` and a label each.
  InMemoryDataset(Shape sample_shape, std::size_t capacity, InMemoryOptions options = {})
      : shape_(std::move(sample_shape)), capacity_(capacity), opt_(options), rng_(options.seed, 0) {
    DTRAIN_REQUIRE(capacity > 0, "InMemoryDataset", "capacity must be at least 1");
    DTRAIN_REQUIRE(options.num_classes >= 0, "InMemoryDataset",
                   "num_classes " << options.num_classes << " is negative");
    elements_ = element_count(shape_, "InMemoryDataset");
    features_.reserve(capacity_ * elements_);
    labels_.reserve(capacity_);
  }

  /// A store of regression pairs: an input of `input_shape` and a target of `target_shape` each
  /// (Shape{1} for one value). sample_shape() is the input's shape; labels and num_classes do not
  /// apply.
  InMemoryDataset(Shape input_shape, Shape target_shape, std::size_t capacity,
                  InMemoryOptions options = {})
      : shape_(std::move(input_shape)),
        target_shape_(std::move(target_shape)),
        capacity_(capacity),
        opt_(options),
        rng_(options.seed, 0) {
    DTRAIN_REQUIRE(capacity > 0, "InMemoryDataset", "capacity must be at least 1");
    elements_ = element_count(shape_, "InMemoryDataset");
    target_elements_ = element_count(target_shape_, "InMemoryDataset");
    DTRAIN_REQUIRE(target_elements_ > 0, "InMemoryDataset",
                   "a target of shape " << to_string(target_shape_) << " holds no value");
    features_.reserve(capacity_ * elements_);
    targets_.reserve(capacity_ * target_elements_);
  }

  /// Appends one labelled sample (`features` holds sample_elements values, copied). Returns the
  /// slot it was stored in, or -1 when the reservoir policy dropped it. Local, blocking only on the
  /// lock. A store of regression pairs refuses it (InvalidArgument: use append_pair).
  std::int64_t append(span<const float> features, std::int32_t label) {
    DTRAIN_REQUIRE(!holds_pairs(), "InMemoryDataset::append",
                   "this store holds regression pairs (target shape "
                       << to_string(target_shape_) << "): append them with append_pair");
    DTRAIN_REQUIRE(features.size() == elements_, "InMemoryDataset::append",
                   "a sample of shape " << to_string(shape_) << " has " << elements_
                                        << " elements, got " << features.size());
    check_label(label);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const std::int64_t slot = place();
    if (slot < 0) return slot;
    const std::size_t s = static_cast<std::size_t>(slot);
    if (s == labels_.size()) {
      labels_.push_back(label);
      features_.insert(features_.end(), features.begin(), features.end());
    } else {
      labels_[s] = label;
      std::memcpy(features_.data() + s * elements_, features.data(), elements_ * sizeof(float));
    }
    count_ = labels_.size();
    return slot;
  }

  /// Appends `labels.size()` samples stored back to back in `features`.
  void append(span<const float> features, span<const std::int32_t> labels) {
    DTRAIN_REQUIRE(features.size() == labels.size() * elements_, "InMemoryDataset::append",
                   labels.size() << " samples need " << labels.size() * elements_
                                 << " feature values, got " << features.size());
    for (std::size_t i = 0; i < labels.size(); ++i)
      append(span<const float>(features.data() + i * elements_, elements_), labels[i]);
  }

  /// Appends one regression pair: `input` holds sample_elements values, `target` target_elements
  /// values (both copied). Returns the slot it was stored in, or -1 when the reservoir policy
  /// dropped it. Local, blocking only on the lock. Only for a store made with a target shape.
  std::int64_t append_pair(span<const float> input, span<const float> target) {
    DTRAIN_REQUIRE(holds_pairs(), "InMemoryDataset::append_pair",
                   "this store holds labelled samples: append them with append(features, label), "
                   "or make it with a target shape for regression pairs");
    DTRAIN_REQUIRE(input.size() == elements_ && target.size() == target_elements_,
                   "InMemoryDataset::append_pair",
                   "a pair of input shape " << to_string(shape_) << " and target shape "
                                            << to_string(target_shape_) << " has " << elements_
                                            << " and " << target_elements_ << " values, got "
                                            << input.size() << " and " << target.size());
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const std::int64_t slot = place();
    if (slot < 0) return slot;
    const std::size_t s = static_cast<std::size_t>(slot);
    if (s == count_) {
      features_.insert(features_.end(), input.begin(), input.end());
      targets_.insert(targets_.end(), target.begin(), target.end());
      ++count_;
    } else {
      std::memcpy(features_.data() + s * elements_, input.data(), elements_ * sizeof(float));
      std::memcpy(targets_.data() + s * target_elements_, target.data(),
                  target_elements_ * sizeof(float));
    }
    return slot;
  }

  /// Appends `n` regression pairs stored back to back: `inputs` holds n * sample_elements values,
  /// `targets` n * target_elements values (pair i: row i of each).
  void append_pairs(span<const float> inputs, span<const float> targets) {
    const std::size_t n = holds_pairs() ? targets.size() / target_elements_ : 0;
    DTRAIN_REQUIRE(
        holds_pairs() && targets.size() == n * target_elements_ && inputs.size() == n * elements_,
        "InMemoryDataset::append_pairs",
        (holds_pairs() ? "" : "this store holds labelled samples; ")
            << "pairs of " << elements_ << " input and " << target_elements_
            << " target values do not divide " << inputs.size() << " inputs and " << targets.size()
            << " targets");
    for (std::size_t i = 0; i < n; ++i)
      append_pair(span<const float>(inputs.data() + i * elements_, elements_),
                  span<const float>(targets.data() + i * target_elements_, target_elements_));
  }

  /// Reads the pairs in slots `indices` (a batch; indices may repeat, in any order): row i of
  /// `inputs` (sample_elements values, transformed by `input_transform`) and of `targets`
  /// (target_elements values, as appended) is slot indices[i]. Local; thread-safe. Throws
  /// InvalidArgument on buffer sizes that do not match, an index outside [0, size()), or a store
  /// of labelled samples.
  void read_pairs(span<const std::int64_t> indices, span<float> inputs, span<float> targets,
                  const Normalize& input_transform = Normalize{}) const {
    const char* op = "InMemoryDataset::read_pairs";
    DTRAIN_REQUIRE(holds_pairs(), op,
                   "this store holds labelled samples: read them with read(), or make it with a "
                   "target shape for regression pairs");
    input_transform.validate(op);
    DTRAIN_REQUIRE(inputs.size() == indices.size() * elements_ &&
                       targets.size() == indices.size() * target_elements_,
                   op,
                   "buffers for " << indices.size() << " pairs need " << indices.size() * elements_
                                  << " inputs and " << indices.size() * target_elements_
                                  << " targets, got " << inputs.size() << " and "
                                  << targets.size());
    std::shared_lock<std::shared_mutex> lock(mutex_);
    for (std::size_t i = 0; i < indices.size(); ++i)
      DTRAIN_REQUIRE(indices[i] >= 0 && static_cast<std::uint64_t>(indices[i]) < count_, op,
                     "sample index " << indices[i] << " (batch row " << i << ") is outside [0, "
                                     << count_ << ")");
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::size_t s = static_cast<std::size_t>(indices[i]);
      input_transform.apply(features_.data() + s * elements_, inputs.data() + i * elements_,
                            elements_);
      std::memcpy(targets.data() + i * target_elements_, targets_.data() + s * target_elements_,
                  target_elements_ * sizeof(float));
    }
  }

  /// Samples currently stored (grows to capacity, then stays).
  std::size_t size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return count_;
  }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Samples ever appended (including replaced and dropped ones).
  std::uint64_t appended() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return appended_;
  }
  /// The features' shape (a regression pair's input).
  Shape sample_shape() const { return shape_; }
  /// Whether this store holds regression pairs (made with a target shape).
  bool holds_pairs() const noexcept { return target_elements_ > 0; }
  /// A regression pair's target shape (empty for a store of labelled samples).
  Shape target_shape() const { return target_shape_; }
  /// Values in one target (0 for a store of labelled samples).
  std::size_t target_elements() const noexcept { return target_elements_; }

  /// Dataset requirement (<dtrain/data/dataset.hpp>). Thread-safe. A store of regression pairs
  /// refuses it (InvalidArgument: use read_pairs).
  void read(span<const std::int64_t> indices, span<float> features, span<std::int32_t> labels,
            const Normalize& transform) const {
    DTRAIN_REQUIRE(!holds_pairs(), "InMemoryDataset::read",
                   "this store holds regression pairs (target shape "
                       << to_string(target_shape_) << "): read them with read_pairs");
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

  /// Checkpoint protocol: the stored samples ("features", then "labels" or, for regression pairs,
  /// "targets") and the eviction state, so an in-situ run resumes with the same store. Loading
  /// requires the same capacity and shapes.
  template <class V>
  void visit_state(V& v) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    std::int64_t count = static_cast<std::int64_t>(count_);
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
      count_ = static_cast<std::size_t>(count);
      labels_.assign(holds_pairs() ? 0 : count_, 0);
      features_.assign(count_ * elements_, 0.0f);
      targets_.assign(count_ * target_elements_, 0.0f);
      appended_ = static_cast<std::uint64_t>(appended);
      rng_ = RngStream(opt_.seed, 0);
      rng_.seek(static_cast<std::uint64_t>(rng_pos));
    }
    Shape fshape{count};
    fshape.insert(fshape.end(), shape_.begin(), shape_.end());
    v.tensor("features", BufferView(features_.data(), features_.size(), DType::f32), fshape);
    if (holds_pairs()) {
      Shape tshape{count};
      tshape.insert(tshape.end(), target_shape_.begin(), target_shape_.end());
      v.tensor("targets", BufferView(targets_.data(), targets_.size(), DType::f32), tshape);
    } else {
      v.tensor("labels", BufferView(labels_.data(), labels_.size(), DType::i32), Shape{count});
    }
  }

 private:
  // Under the write lock: the slot of the next sample (count_ while the store grows; the caller
  // then appends), or -1 when the reservoir drops it.
  std::int64_t place() {
    const std::uint64_t k = appended_++;
    if (count_ < capacity_) return static_cast<std::int64_t>(count_);
    if (opt_.eviction == Eviction::oldest) return static_cast<std::int64_t>(k % capacity_);
    const std::uint64_t j = rng_.below(k + 1);
    return j < capacity_ ? static_cast<std::int64_t>(j) : -1;
  }

  void check_label(std::int32_t label) const {
    DTRAIN_REQUIRE(label >= 0 && (opt_.num_classes == 0 || label < opt_.num_classes),
                   "InMemoryDataset::append",
                   "label " << label << " is outside [0, "
                            << (opt_.num_classes ? std::to_string(opt_.num_classes) : "2^31")
                            << ")");
  }

  Shape shape_;
  Shape target_shape_;  // empty for labelled samples
  std::size_t capacity_;
  std::size_t elements_ = 0;
  std::size_t target_elements_ = 0;  // 0 for labelled samples
  std::size_t count_ = 0;
  InMemoryOptions opt_;
  mutable std::shared_mutex mutex_;
  std::vector<float> features_;
  std::vector<std::int32_t> labels_;
  std::vector<float> targets_;
  std::uint64_t appended_ = 0;
  RngStream rng_;
};

}  // namespace dtrain
