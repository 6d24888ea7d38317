// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the per-size table that `automatic` all-reduce follows.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>

namespace dtrain {

/// One row of a communicator's all-reduce decision table: messages of `min_bytes` bytes per
/// rank or more (up to the next row's min_bytes) run `algo`. Plain value type.
struct AllreduceDecision {
  std::size_t min_bytes = 0;
  AllreduceAlgorithm algo = AllreduceAlgorithm::ring;
  bool operator==(const AllreduceDecision& o) const noexcept {
    return min_bytes == o.min_bytes && algo == o.algo;
  }
  bool operator!=(const AllreduceDecision& o) const noexcept { return !(*this == o); }
};

/// A decision table: rows in ascending min_bytes, the first at 0, no two neighbours alike.
using AllreduceDecisions = std::vector<AllreduceDecision>;

/// The algorithm `table` gives to `bytes` (ring for an empty table). Local, pure.
inline AllreduceAlgorithm lookup_decision(const AllreduceDecisions& table,
                                          std::size_t bytes) noexcept {
  AllreduceAlgorithm a = AllreduceAlgorithm::ring;
  for (const AllreduceDecision& d : table) {
    if (d.min_bytes > bytes) break;
    a = d.algo;
  }
  return a;
}

namespace detail {

/// Largest size the tables describe row by row (larger messages take the last row): 2^40 B.
inline constexpr int kDecisionMaxLog2 = 40;

/// Table of `pick(bytes)` over the bands [2^k, 2^(k+1)), each decided at its geometric middle
/// 2^(k+1/2) (the band [0, 2) at 1 B), neighbours with the same algorithm merged. Pure.
template <class Pick>
AllreduceDecisions decisions_from(Pick&& pick) {
  AllreduceDecisions t;
  for (int k = -1; k <= kDecisionMaxLog2; ++k) {
    const std::size_t lo = k < 0 ? 0 : std::size_t{1} << k;
    const std::size_t at =
        k < 0 ? 1 : static_cast<std::size_t>(std::ldexp(std::sqrt(2.0), k));  // 2^(k+1/2)
    const AllreduceAlgorithm a = pick(at);
    if (k == 0) continue;  // [1, 2) belongs to the band [0, 2)
    if (t.empty() || t.back().algo != a) t.push_back(AllreduceDecision{lo, a});
  }
  return t;
}

}  // namespace detail
}  // namespace dtrain
