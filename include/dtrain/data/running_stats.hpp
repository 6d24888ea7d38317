// SPDX-License-Identifier: BSD-3-Clause
// dtrain: RunningStats, per-channel mean and variance of a stream of samples (a running
// simulation's fields), merged across ranks deterministically, checkpointed, and used to normalise
// batches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain {

/// Count, mean and variance of each channel of the samples seen so far. A batch is channels-first
/// in C order, [batch][channels][inner]: value j of channel c of sample b is at
/// (b * channels + c) * inner + j, so one channel's statistics cover its whole field (inner = the
/// spatial points; a Fortran x(nx, ny, nchan, nbatch) is this layout with inner = nx * ny). For
/// per-feature statistics of flat feature vectors, pass inner = 1 (each feature is a channel).
///
/// Each update folds the batch's own (count, mean, M2) per channel, computed in double with two
/// passes, into the running ones with Chan et al.'s pairwise combination (Welford's update when
/// the batch is one value), so a long stream keeps its accuracy in float64. merged() combines the
/// ranks' statistics the same way, in rank order, so every rank gets the same bits.
/// Local object: one thread at a time; nothing is shared. The caller owns the batches.
class RunningStats {
 public:
  /// Statistics of `channels` channels (at least 1). `min_std` floors the standard deviation that
  /// normalise divides by, so a constant channel maps to zero instead of dividing by zero.
  explicit RunningStats(std::size_t channels, double min_std = 1e-12)
      : count_(channels, 0), mean_(channels, 0.0), m2_(channels, 0.0), min_std_(min_std) {
    DTRAIN_REQUIRE(channels > 0, "RunningStats", "needs at least one channel");
    DTRAIN_REQUIRE(min_std > 0 && std::isfinite(min_std), "RunningStats",
                   "min_std must be positive and finite, got " << min_std);
  }

  std::size_t channels() const noexcept { return count_.size(); }
  /// Values seen of channel `c` (local; summed over ranks in merged()).
  std::int64_t count(std::size_t c) const { return count_.at(c); }
  /// Mean of channel `c`; 0 before any value.
  double mean(std::size_t c) const { return mean_.at(c); }
  /// Population variance (M2 / count) of channel `c`; 0 before any value.
  double variance(std::size_t c) const {
    return count_.at(c) > 0 ? m2_[c] / static_cast<double>(count_[c]) : 0.0;
  }
  /// Population standard deviation of channel `c`.
  double stddev(std::size_t c) const { return std::sqrt(variance(c)); }

  /// Local, blocking: adds a batch of f32 or f64 values laid out [batch][channels][inner]; the
  /// batch count is x.size() / (channels() * inner). An empty batch changes nothing. Throws
  /// InvalidArgument when x is not whole samples or holds a non-finite value (nothing is changed
  /// then).
  void update(span<const float> x, std::size_t inner) { update_impl(x.data(), x.size(), inner); }
  void update(span<const double> x, std::size_t inner) { update_impl(x.data(), x.size(), inner); }

  /// Local: folds `other` (statistics of other values of the same channels) into this.
  void merge(const RunningStats& other) {
    DTRAIN_REQUIRE(other.channels() == channels(), "RunningStats::merge",
                   "merging statistics of " << other.channels() << " channels into " << channels());
    for (std::size_t c = 0; c < channels(); ++c)
      combine(c, other.count_[c], other.mean_[c], other.m2_[c]);
  }

  /// Collective, blocking: the statistics of every rank's values together, identical to the bit on
  /// every rank (an all-gather of each rank's (count, mean, M2), combined in rank order 0, 1, ...
  /// from empty statistics). This object keeps its local statistics, so keep updating it and call
  /// merged() again when the global ones are needed. Every rank must call it with the same number
  /// of channels. Cost: an all-gather of 3 * channels() doubles per rank.
  template <class Transport>
  RunningStats merged(Communicator<Transport>& comm) const {
    const std::size_t C = channels(), p = static_cast<std::size_t>(comm.size());
    std::vector<double> mine(3 * C), all(3 * C * p);
    for (std::size_t c = 0; c < C; ++c) {
      mine[c] = static_cast<double>(count_[c]);  // exact up to 2^53 values
      mine[C + c] = mean_[c];
      mine[2 * C + c] = m2_[c];
    }
    comm.allgather(BufferView(mine.data(), mine.size(), DType::f64),
                   BufferView(all.data(), all.size(), DType::f64));
    RunningStats out(C, min_std_);
    for (std::size_t r = 0; r < p; ++r) {
      const double* s = all.data() + r * 3 * C;
      for (std::size_t c = 0; c < C; ++c)
        out.combine(c, static_cast<std::int64_t>(s[c]), s[C + c], s[2 * C + c]);
    }
    return out;
  }

  /// Local: x <- (x - mean) / max(stddev, min_std) per channel, in place, for a batch laid out as
  /// in update. Throws InvalidArgument when x is not whole samples or a channel has no values yet.
  template <class T>
  void normalise(span<T> x, std::size_t inner) const {
    apply(x.data(), x.size(), inner, "RunningStats::normalise", false);
  }
  /// Local: the inverse of normalise, x <- x * max(stddev, min_std) + mean per channel, in place.
  template <class T>
  void denormalise(span<T> x, std::size_t inner) const {
    apply(x.data(), x.size(), inner, "RunningStats::denormalise", true);
  }

 private:
  friend struct serializer<RunningStats>;

  std::size_t samples_of(std::size_t n, std::size_t inner, const char* op) const {
    DTRAIN_REQUIRE(inner > 0, op, "inner extent must be at least 1");
    const std::size_t per = channels() * inner;
    DTRAIN_REQUIRE(n % per == 0, op,
                   n << " values are not whole samples of " << channels() << " channels x " << inner
                     << " values");
    return n / per;
  }

  // Chan et al.: (na, ma, M2a) + (nb, mb, M2b); delta scaled by nb / n first so that a huge count
  // does not overflow the product.
  void combine(std::size_t c, std::int64_t nb, double mb, double m2b) {
    if (nb == 0) return;
    const std::int64_t na = count_[c], n = na + nb;
    const double delta = mb - mean_[c], wb = static_cast<double>(nb) / static_cast<double>(n);
    mean_[c] += delta * wb;
    m2_[c] += m2b + delta * delta * static_cast<double>(na) * wb;
    count_[c] = n;
  }

  template <class T>
  void update_impl(const T* x, std::size_t n, std::size_t inner) {
    const char* op = "RunningStats::update";
    const std::size_t B = samples_of(n, inner, op), C = channels();
    if (B == 0) return;
    for (std::size_t k = 0; k < n; ++k)
      DTRAIN_REQUIRE(std::isfinite(x[k]), op,
                     "value " << k << " (sample " << k / (C * inner) << ", channel "
                              << k / inner % C << ") is not finite: " << x[k]);
    for (std::size_t c = 0; c < C; ++c) {
      double sum = 0;
      for (std::size_t b = 0; b < B; ++b) {
        const T* v = x + (b * C + c) * inner;
        for (std::size_t j = 0; j < inner; ++j) sum += static_cast<double>(v[j]);
      }
      const std::int64_t nb = static_cast<std::int64_t>(B * inner);
      const double mb = sum / static_cast<double>(nb);
      double m2b = 0;
      for (std::size_t b = 0; b < B; ++b) {
        const T* v = x + (b * C + c) * inner;
        for (std::size_t j = 0; j < inner; ++j) {
          const double d = static_cast<double>(v[j]) - mb;
          m2b += d * d;
        }
      }
      combine(c, nb, mb, m2b);
    }
  }

  template <class T>
  void apply(T* x, std::size_t n, std::size_t inner, const char* op, bool inverse) const {
    const std::size_t B = samples_of(n, inner, op), C = channels();
    for (std::size_t c = 0; c < C; ++c)
      DTRAIN_REQUIRE(count_[c] > 0, op, "channel " << c << " has no values yet (update first)");
    for (std::size_t c = 0; c < C; ++c) {
      const double m = mean_[c], s = std::max(stddev(c), min_std_), inv = 1.0 / s;
      for (std::size_t b = 0; b < B; ++b) {
        T* v = x + (b * C + c) * inner;
        for (std::size_t j = 0; j < inner; ++j) {
          const double d = static_cast<double>(v[j]);
          v[j] = static_cast<T>(inverse ? d * s + m : (d - m) * inv);
        }
      }
    }
  }

  std::vector<std::int64_t> count_;
  std::vector<double> mean_, m2_;
  double min_std_;
};

/// Checkpoint protocol of RunningStats: "count" (i64), "mean" and "m2" (f64), one value per
/// channel. Loading requires the same number of channels (the checkpoint's shape check).
template <>
struct serializer<RunningStats> {
  template <class V>
  static void visit(V& v, RunningStats& s) {
    const Shape shape{static_cast<std::int64_t>(s.channels())};
    v.tensor("count", BufferView(s.count_.data(), s.count_.size(), DType::i64), shape);
    v.tensor("mean", BufferView(s.mean_.data(), s.mean_.size(), DType::f64), shape);
    v.tensor("m2", BufferView(s.m2_.data(), s.m2_.size(), DType::f64), shape);
    if (v.loading()) {
      for (std::size_t c = 0; c < s.channels(); ++c)
        DTRAIN_REQUIRE(s.count_[c] >= 0 && std::isfinite(s.mean_[c]) && s.m2_[c] >= 0,
                       "RunningStats: restore",
                       "channel " << c << " holds count " << s.count_[c] << ", mean " << s.mean_[c]
                                  << ", M2 " << s.m2_[c]);
    }
  }
};

}  // namespace dtrain
