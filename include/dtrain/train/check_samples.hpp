// SPDX-License-Identifier: BSD-3-Clause
// dtrain: check_samples, a check of one rank's share of a labelled dataset before training on it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/transform.hpp>

namespace dtrain {

/// What check_samples checks, and how its errors name things.
struct SampleCheck {
  /// Labels must lie in [0, num_classes) (0: only non-negative).
  std::int64_t num_classes = 0;
  /// The operation an error names (its message reads "dtrain: rank R: <operation>: ...").
  std::string operation = "check_samples";
  /// How errors name the labels and the features, e.g. "'data.h5' dataset 'train/labels'".
  std::string labels_name = "labels", features_name = "features";
  /// Rows read at a time.
  std::size_t chunk = 1000;
};

/// Sums over the feature values check_samples read (e.g. for a mean and standard deviation over
/// all ranks: all-reduce the three fields).
struct FeatureStats {
  double sum = 0, sum_squares = 0, count = 0;
};

/// Local (no communication; wrap it in agreed() so that a bad row on one rank ends the job on
/// all). Reads this rank's contiguous share of `dataset` (rank r of p: rows [n r / p,
/// n (r + 1) / p)) once, untransformed, and checks every label against `check.num_classes` and
/// every feature value for NaN and Inf. Throws IoError naming the labels or features, the row,
/// the label or the element. Adds the values read to `stats` when given. Blocking; the buffers are
/// this call's own; thread-safe as far as the dataset's read() is.
template <class Dataset>
void check_samples(Dataset& dataset, int rank, int world, const SampleCheck& check,
                   FeatureStats* stats = nullptr) {
  static_assert(is_dataset_v<Dataset>, "check_samples: Dataset must meet the dataset requirement");
  const std::size_t n = dataset.size(), p = static_cast<std::size_t>(world),
                    r = static_cast<std::size_t>(rank);
  const std::size_t begin = n * r / p, end = n * (r + 1) / p;
  const std::size_t chunk = std::max<std::size_t>(check.chunk, 1);
  const std::size_t e = sample_elements(dataset);
  std::vector<std::int64_t> idx;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::size_t s = begin; s < end; s += chunk) {
    const std::size_t b = std::min(chunk, end - s);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::int64_t>(s + i);
    x.resize(b * e);
    y.resize(b);
    dataset.read(span<const std::int64_t>(idx.data(), b), span<float>(x.data(), x.size()),
                 span<std::int32_t>(y.data(), b), Normalize{});
    for (std::size_t i = 0; i < b; ++i) {
      if (y[i] < 0 || (check.num_classes > 0 && y[i] >= check.num_classes))
        raise<IoError>(
            check.operation,
            check.labels_name + ": row " + std::to_string(s + i) + " has label " +
                std::to_string(y[i]) + ", outside [0, " +
                (check.num_classes > 0 ? std::to_string(check.num_classes) + ") for this " +
                                             std::to_string(check.num_classes) + "-class model"
                                       : std::string("2^31)")));
      const float* row = x.data() + i * e;
      for (std::size_t j = 0; j < e; ++j)
        if (!std::isfinite(row[j]))
          raise<IoError>(check.operation, check.features_name + ": row " + std::to_string(s + i) +
                                              " holds " + (std::isnan(row[j]) ? "NaN" : "Inf") +
                                              " at element " + std::to_string(j));
      if (stats)
        for (std::size_t j = 0; j < e; ++j) {
          stats->sum += row[j];
          stats->sum_squares += static_cast<double>(row[j]) * row[j];
        }
    }
    if (stats) stats->count += static_cast<double>(b * e);
  }
}

}  // namespace dtrain
