// dtrain: the alpha-beta-gamma cost model that picks an all-reduce algorithm.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {

/// Costs of one point-to-point step: alpha seconds per message, beta seconds per byte moved,
/// gamma seconds per byte reduced. Communicators measure it once (see
/// Communicator::cost_model) or take it from the user. Plain value type.
struct CostModel {
  double alpha = 0;
  double beta = 0;
  double gamma = 0;
  /// Node-shared segments (0 when the transport has none): one counter hand-off between ranks
  /// in seconds, the shm algorithm's cost per byte of vector (copies in and out, cross-core
  /// traffic and reduction together, measured on a bandwidth-bound vector), and its pipelining
  /// chunk in bytes.
  double shm_alpha = 0;
  double shm_beta = 0;
  double shm_chunk = 256 * 1024;

  bool valid() const noexcept { return alpha > 0 && beta > 0 && gamma >= 0; }

  /// Predicted seconds for an all-reduce of `bytes` bytes per rank over `p` ranks with `algo`
  /// (not automatic). Pure.
  double predict(AllreduceAlgorithm algo, std::size_t bytes, int p) const {
    if (p <= 1) return 0;
    const double n = static_cast<double>(bytes);
    int lg = 0;
    while ((2 << lg) <= p) ++lg;  // lg = floor(log2 p)
    const int pp = 1 << lg;       // largest power of two <= p
    const bool odd = pp != p;
    // Ranks folded in and out when p is not a power of two: one full-vector send each way and
    // one reduction.
    const double fold = odd ? 2 * (alpha + n * beta) + n * gamma : 0;
    const double fp = static_cast<double>(p), fpp = static_cast<double>(pp);
    switch (algo) {
      case AllreduceAlgorithm::ring:
        return 2 * (fp - 1) * alpha + 2 * (fp - 1) / fp * n * beta + (fp - 1) / fp * n * gamma;
      case AllreduceAlgorithm::rhd:
        return 2 * lg * alpha + 2 * (fpp - 1) / fpp * n * beta + (fpp - 1) / fpp * n * gamma + fold;
      case AllreduceAlgorithm::rd: return lg * (alpha + n * beta + n * gamma) + fold;
      case AllreduceAlgorithm::tree: {
        // Pipelined double binary tree: the depth costs latency per segment in flight; each rank
        // moves about the whole vector up and down (half through each tree).
        const int depth = static_cast<int>(std::ceil(std::log2(fp)));
        return 4 * depth * alpha + 2 * n * beta + n * gamma;
      }
      case AllreduceAlgorithm::shm: {
        if (shm_alpha <= 0) return 1e300;  // not available
        // Per chunk: three counter hand-offs; per byte: what the measurement saw.
        const double chunks = std::ceil(n / shm_chunk);
        return 3 * std::max(chunks, 1.0) * shm_alpha + n * shm_beta;
      }
      case AllreduceAlgorithm::ordered:  // the ring's bytes and reductions, p-1 messages a step
        return predict(AllreduceAlgorithm::ring, bytes, p);
      case AllreduceAlgorithm::ordered_shm: return predict(AllreduceAlgorithm::shm, bytes, p);
      case AllreduceAlgorithm::automatic: break;
    }
    raise<InvalidArgument>("CostModel::predict", "automatic is not an algorithm to predict");
  }

  /// The algorithm with the smallest predicted time (ties go to ring, then rhd, rd, tree, shm).
  AllreduceAlgorithm best(std::size_t bytes, int p) const {
    AllreduceAlgorithm pick = AllreduceAlgorithm::ring;
    double t = predict(pick, bytes, p);
    for (AllreduceAlgorithm a : {AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd,
                                 AllreduceAlgorithm::tree, AllreduceAlgorithm::shm}) {
      const double ta = predict(a, bytes, p);
      if (ta < t) {
        t = ta;
        pick = a;
      }
    }
    return pick;
  }
};

}  // namespace dtrain
