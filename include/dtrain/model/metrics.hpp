// SPDX-License-Identifier: BSD-3-Clause
// dtrain: classification metrics on host logits.
#pragma once

#include <cstdint>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// Index of the largest of `classes` scores (the first on ties). Local, pure.
template <class T>
std::int32_t argmax(const T* scores, std::int64_t classes) {
  std::int64_t best = 0;
  for (std::int64_t c = 1; c < classes; ++c)
    if (scores[c] > scores[best]) best = c;
  return static_cast<std::int32_t>(best);
}

/// Number of rows whose argmax equals the label. Integer, so ranks can sum it exactly before
/// dividing by the global sample count. Local.
template <class T>
std::int64_t count_correct(const T* logits, const std::int32_t* labels, std::int64_t batch,
                           std::int64_t classes) {
  DTRAIN_REQUIRE(batch >= 0 && classes > 0, "count_correct",
                 "bad extents batch=" << batch << " classes=" << classes);
  std::int64_t correct = 0;
  for (std::int64_t r = 0; r < batch; ++r)
    correct += argmax(logits + r * classes, classes) == labels[r] ? 1 : 0;
  return correct;
}

/// Fraction of rows classified correctly (0 for an empty batch). Local.
template <class T>
double accuracy(const T* logits, const std::int32_t* labels, std::int64_t batch,
                std::int64_t classes) {
  if (batch == 0) return 0.0;
  return static_cast<double>(count_correct(logits, labels, batch, classes)) /
         static_cast<double>(batch);
}

}  // namespace dtrain
