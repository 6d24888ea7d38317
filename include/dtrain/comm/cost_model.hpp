// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the alpha-beta-gamma cost model that picks an all-reduce algorithm.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/topology.hpp>
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
  /// chunk in bytes. With several nodes, measured among the ranks of a node on its segments:
  /// the intra-node part of hier and hier_leader (flat shm is then unavailable).
  double shm_alpha = 0;
  double shm_beta = 0;
  double shm_chunk = 256 * 1024;
  /// Messages between nodes (0 = the same as alpha / beta): seconds per message and per byte.
  /// alpha and beta then describe messages inside a node. Used by the four-argument predict and
  /// best when the topology has several nodes.
  double inter_alpha = 0, inter_beta = 0;
  /// The factor by which inter_beta grows when every rank of a node sends to another node at
  /// once (they share the node's links, or on fake nodes its cores): rhd and rd, whose long
  /// steps cross nodes from every rank, and hier, whose parts cross from every rank. 1: a link
  /// per rank, or not measured. hier_leader and the ring cross from one rank of a node at a time.
  double inter_share = 1;
  /// Seconds every collective call costs whatever the algorithm and size (plan dispatch and the
  /// fingerprint exchange); 0 = not measured.
  double call = 0;
  /// Per-byte terms (beta, gamma, shm_beta) are measured on vectors that stay in the last-level
  /// cache; once the node's working set, 2 * bytes * cache_ranks (input and output of every rank
  /// sharing the cache), exceeds cache_bytes, they are multiplied by mem_factor (the measured
  /// ratio of a memory-bound to a cache-resident copy). cache_bytes 0 = no such switch.
  double cache_bytes = 0, mem_factor = 1;
  int cache_ranks = 1;

  bool valid() const noexcept { return alpha > 0 && beta > 0 && gamma >= 0; }

  /// Predicted seconds for an all-reduce of `bytes` bytes per rank over `p` ranks with `algo`
  /// (not automatic): the fixed per-call cost plus the algorithm's steps. Pure.
  double predict(AllreduceAlgorithm algo, std::size_t bytes, int p) const {
    if (p <= 1) return 0;
    return call + at_size(bytes).steps(algo, bytes, p);
  }

  /// This model with the per-byte terms a vector of `bytes` per rank sees (mem_factor applied
  /// beyond the cache, see cache_bytes). Pure.
  CostModel at_size(std::size_t bytes) const {
    CostModel m = *this;
    if (cache_bytes > 0 && mem_factor > 1 &&
        2.0 * static_cast<double>(bytes) * std::max(cache_ranks, 1) > cache_bytes) {
      m.beta *= mem_factor;
      m.gamma *= mem_factor;
      m.shm_beta *= mem_factor;
      m.cache_bytes = 0;
    }
    return m;
  }

  /// The algorithm's message steps over `p` ranks, without the per-call cost or the cache
  /// switch (what predict adds). Pure.
  double steps(AllreduceAlgorithm algo, std::size_t bytes, int p) const {
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
        // Per chunk: three counter hand-offs; per byte: what the measurement saw. Calls of at
        // most 4 KiB run in one hand-off (algo/shm.hpp, small_call) unless every rank's buffers
        // lie in its heap (two, no copies); the calibration's one-chunk measurement is one of
        // those, and a third of it stands for a hand-off of the larger calls: rough at 4 KiB,
        // where the calibration's probes measure every algorithm.
        const double chunks = std::ceil(n / shm_chunk);
        return 3 * std::max(chunks, 1.0) * shm_alpha + n * shm_beta;
      }
      case AllreduceAlgorithm::ordered:  // the ring's bytes and reductions, p-1 messages a step
        return steps(AllreduceAlgorithm::ring, bytes, p);
      case AllreduceAlgorithm::ordered_shm: return steps(AllreduceAlgorithm::shm, bytes, p);
      case AllreduceAlgorithm::hier:
      case AllreduceAlgorithm::hier_leader: return steps(algo, bytes, p, Topology::flat(p));
      case AllreduceAlgorithm::automatic: break;
    }
    raise<InvalidArgument>("CostModel::predict", "automatic is not an algorithm to predict");
  }

  /// Predicted seconds over `p` ranks grouped in nodes as `topo` (pure). With several nodes the
  /// flat algorithms pay the larger of alpha and inter_alpha, of beta and inter_beta, on every
  /// message (their rings and butterflies cross nodes; rhd and rd at inter_beta * inter_share
  /// where nodes have several ranks) and shm is unavailable. hier: intra-node reduce-scatter and
  /// all-gather (the shm model over the largest node where shm was measured, else one message round
  /// each way at alpha / beta), plus an all-reduce over the nodes for each of the ceil(Lmax / Lmin)
  /// parts of bytes / Lmax that a rank of the smallest node owns, at inter_alpha / inter_beta *
  /// inter_share.
  /// hier_leader: the leader receives and reduces L - 1 vectors and sends L - 1 back (or the shm
  /// model), plus an all-reduce over the nodes at inter_alpha / inter_beta. Between the nodes
  /// both run the flat algorithm best_inter picks (ring, rhd, rd or tree), as they do.
  double predict(AllreduceAlgorithm algo, std::size_t bytes, int p, const Topology& topo) const {
    if (p <= 1) return 0;
    const double t = at_size(bytes).steps(algo, bytes, p, topo);
    return t >= 1e299 ? t : call + t;
  }

  /// The four-argument predict without the per-call cost or the cache switch. Pure.
  double steps(AllreduceAlgorithm algo, std::size_t bytes, int p, const Topology& topo) const {
    if (p <= 1) return 0;
    const bool multi = topo.nodes > 1;
    const CostModel inter = multi ? between_nodes() : *this;
    const double n = static_cast<double>(bytes);
    const int N = std::max(topo.nodes, 1), L = std::max(topo.max_ranks_per_node, 1);
    // Every rank of a node sending to another node at once (see inter_share).
    CostModel crossing = inter;
    if (multi && L > 1) crossing.beta *= std::max(inter_share, 1.0);
    // A flat algorithm's step has every rank send at once, some inside a node and some between
    // nodes: it ends with the slower of the two. (Usually the link between nodes; a NIC can
    // outrun a message inside a node, and on fake nodes the pair between nodes, measured while
    // the other ranks sleep, moved 0.2 ns/B where the pairs inside a node, all at once, moved
    // 1.07: the ring priced at the former predicted 1.9 ms for 4 MiB and ran 5.3;
    // benchmarks/RESULTS.md.)
    const auto slower = [this](CostModel m) {
      m.alpha = std::max(m.alpha, alpha);
      m.beta = std::max(m.beta, beta);
      return m;
    };
    const int Lmin = std::max(std::min(topo.min_ranks_per_node, L), 1);
    const double fL = L;
    switch (algo) {
      case AllreduceAlgorithm::hier: {
        double intra = 0;
        if (L > 1)
          intra = shm_alpha > 0
                      ? steps(AllreduceAlgorithm::shm, bytes, L)
                      : 2 * alpha + 2 * (fL - 1) / fL * n * beta + (fL - 1) / fL * n * gamma;
        const double parts = std::ceil(fL / Lmin);
        const auto part_bytes = static_cast<std::size_t>(std::ceil(n / fL));
        return intra + parts * crossing.steps(crossing.best_inter(part_bytes, N), part_bytes, N);
      }
      case AllreduceAlgorithm::hier_leader: {
        double intra = 0;
        if (L > 1)
          intra = shm_alpha > 0 ? steps(AllreduceAlgorithm::shm, bytes, L)
                                : 2 * alpha + (fL - 1) * n * (2 * beta + gamma);
        return intra + inter.steps(inter.best_inter(bytes, N), bytes, N);
      }
      case AllreduceAlgorithm::shm:
      case AllreduceAlgorithm::ordered_shm:
        if (multi) return 1e300;  // needs every rank on one node
        break;
      case AllreduceAlgorithm::rhd:
      case AllreduceAlgorithm::rd: return slower(crossing).steps(algo, bytes, p);
      default: break;
    }
    return slower(inter).steps(algo, bytes, p);
  }

  /// The algorithm with the smallest predicted time over `p` ranks grouped as `topo`: the
  /// choice of best(bytes, p) among the flat algorithms (shm only on one node), and hier /
  /// hier_leader as well when topo.hierarchical().
  AllreduceAlgorithm best(std::size_t bytes, int p, const Topology& topo) const {
    AllreduceAlgorithm pick = AllreduceAlgorithm::ring;
    double t = predict(pick, bytes, p, topo);
    for (AllreduceAlgorithm a :
         {AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd, AllreduceAlgorithm::tree,
          AllreduceAlgorithm::shm, AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader}) {
      if ((a == AllreduceAlgorithm::hier || a == AllreduceAlgorithm::hier_leader) &&
          !topo.hierarchical())
        continue;
      const double ta = predict(a, bytes, p, topo);
      if (ta < t) {
        t = ta;
        pick = a;
      }
    }
    return pick;
  }

  /// This model with alpha / beta replaced by inter_alpha / inter_beta where those are set: the
  /// cost of messages between nodes. Pure.
  CostModel between_nodes() const {
    CostModel m = *this;
    if (inter_alpha > 0) m.alpha = inter_alpha;
    if (inter_beta > 0) m.beta = inter_beta;
    return m;
  }

  /// The flat algorithm (ring, rhd, rd or tree; ties in that order) with the fewest predicted
  /// steps for `bytes` per rank over `n` ranks, as hier and hier_leader run among nodes: called
  /// on the model whose alpha / beta are the between-node terms (steps uses them as given).
  /// Pure.
  AllreduceAlgorithm best_inter(std::size_t bytes, int n) const {
    AllreduceAlgorithm pick = AllreduceAlgorithm::ring;
    double t = steps(pick, bytes, n);
    for (AllreduceAlgorithm a :
         {AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd, AllreduceAlgorithm::tree}) {
      const double ta = steps(a, bytes, n);
      if (ta < t) {
        t = ta;
        pick = a;
      }
    }
    return pick;
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
