// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what the calibration MEASURES for the cost model, and the fit (CostModel's terms).
//
// Every quantity is measured once per round, one after the other, for kRounds rounds, with a
// pause between rounds; each takes the median over its rounds (a latency sample is the minimum
// of a short burst), so a burst of load from another process spoils a round or two of each
// quantity, not the result. The quantities:
// - alpha, beta: a ping-pong and a 4 MiB exchange with partner r^1;
// - gamma: a local 4 MiB reduction;
// - call: a one-element rd all-reduce, the fixed cost of a call;
// - shm_alpha, shm_beta: a one-chunk and a 4 MiB shm all-reduce where there are node-shared
//   segments (over the whole group on one node; with several nodes among each node's ranks on
//   its segments, as hier uses them);
// - with several nodes, inter_alpha and inter_beta: a ping-pong and a 4 MiB exchange between the
//   first ranks of nodes 2k and 2k+1, while the other ranks of each node wait blocked, as
//   hier_leader's do; the exchange takes its fastest round, not the median: a single pair's
//   transfer is only slowed by a disturbance;
// - where nodes have several ranks, inter_share: the same exchange between every rank and its
//   counterpart there, all pairs at once;
// - on a node's first rank, in the first kCopyRounds rounds, copies of working sets from 8 to
//   64 MiB: the factor by which per-byte costs grow once a node's working set leaves the cache,
//   and where it leaves it (cache_knee).
// Every rank's figures are then agreed (maximum over ranks) and fitted (fit_model), so every rank
// computes the same model, bit for bit. About 0.1 s at 2 ranks on an idle 2-core machine.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/calibration/timing.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Rounds of the model's measurements.
inline constexpr int kRounds = 5;
/// Bytes of the bandwidth-bound measurements (exchanges, reduction, shm): beyond the caches.
inline constexpr std::size_t kModelBytes = 4u << 20;

/// The copies that find where a node's cache ends (a node's first rank, kCopyRounds rounds):
/// source and destination of kCopyFirstBytes each (their working set stays in any last-level
/// cache), then of twice, four and eight times that, prefixes of two buffers of kCopyMaxBytes.
/// Each time per byte is the median over the rounds. The sizes are measured rather than read from
/// the machine: where sysfs has no cache entries (a VM here), sysconf reported a 508 MiB level-3
/// cache that the copies place at 32-48 MiB, and buffers sized by that report cost a node's first
/// rank 256 MiB of peak memory for the calibration alone (benchmarks/RESULTS.md). At most
/// 2 * kCopyMaxBytes: caches beyond a 64 MiB working set show no knee here, and the model then
/// keeps the cache's per-byte terms at every size.
inline constexpr std::size_t kCopyFirstBytes = 4u << 20;
inline constexpr std::size_t kCopyMaxBytes = 32u << 20;
inline constexpr int kCopyRounds = 3;
/// Slower than the smallest copy by less than this, the largest copy shows no memory-bound
/// regime (the working sets tried all fit a cache, or the machine's memory keeps up).
inline constexpr double kKneeMinFactor = 1.3;

/// Where copies leave the cache: from the per-byte times of copies of ascending working sets
/// `ws` (source and destination bytes), the smallest working set whose copy ran at least halfway
/// in ratio from the first one's per-byte time to the last one's (their geometric mean: the
/// model's switch from the one to the other is then off by at most the square root of
/// mem_factor at the sizes tried), as CostModel::cache_bytes; 0 (the model never switches) when
/// the last ran less than kKneeMinFactor times slower than the first, or the times are unusable.
/// Pure.
inline double cache_knee(const std::vector<double>& ws, const std::vector<double>& per_byte) {
  if (ws.size() < 2 || ws.size() != per_byte.size()) return 0;
  const double first = per_byte.front(), last = per_byte.back();
  if (!(first > 0) || !(last >= kKneeMinFactor * first)) return 0;
  const double half = std::sqrt(first * last);
  for (std::size_t i = 1; i < ws.size(); ++i)
    if (per_byte[i] >= half) return ws[i];
  return ws.back();
}

/// The figures a model is fitted from, agreed over ranks (each the slowest rank's), seconds
/// unless said otherwise. 0 where not measured.
struct ModelFigures {
  enum Index : std::size_t {
    alpha,           // half a ping-pong with the partner (median over rounds)
    exchange,        // one kModelBytes exchange with it
    reduce,          // one local reduction of kModelBytes
    shm_tiny,        // one one-chunk shm all-reduce
    shm_big,         // one shm all-reduce of kModelBytes
    inter_alpha,     // half a ping-pong between the first ranks of two nodes
    inter_exchange,  // one kModelBytes exchange between them (fastest round)
    call,            // one one-element rd all-reduce
    copy_cache,      // per byte, the smallest copy (in cache)
    copy_memory,     // per byte, the largest copy
    machine_ranks,   // ranks sharing a machine's cache (count)
    knee,            // cache_knee of the copies (bytes of working set)
    slot_bytes,      // the shm segments' slot (bytes)
    inter_shared,    // one kModelBytes exchange of every rank with its counterpart, all at once
    count
  };
  std::array<double, count> v{};
  double operator[](Index i) const { return v[i]; }
};

/// The model from agreed figures `m` of p ranks (`multi`: over several nodes). Pure; every rank
/// computes the same from the same figures.
inline CostModel fit_model(const ModelFigures& m, int p, bool multi) {
  using F = ModelFigures;
  const double big = static_cast<double>(kModelBytes);
  CostModel cm;
  const double alpha = m[F::alpha];
  cm.alpha = std::max(alpha, 1e-9);
  cm.beta = std::max((m[F::exchange] - alpha) / big, 1e-13);  // agreed: the paired ranks
  cm.gamma = std::max(m[F::reduce] / big, 0.0);
  if (multi) {  // measured between the nodes' first ranks
    const double ia = m[F::inter_alpha], ix = m[F::inter_exchange], is = m[F::inter_shared];
    cm.inter_alpha = std::max(ia, 1e-9);
    cm.inter_beta = std::max((ix - ia) / big, 1e-13);
    if (is > 0 && ix > ia) cm.inter_share = std::max((is - ia) / (ix - ia), 1.0);
  }
  // The fixed cost of a call: the one-element rd all-reduce less its modelled steps.
  cm.call = std::max(m[F::call] - cm.steps(AllreduceAlgorithm::rd, sizeof(float), p), 0.0);
  // Agreed: some rank measured shm (every rank of one node, or of a node).
  if (m[F::slot_bytes] > 0) {
    const double tiny_t = m[F::shm_tiny], big_t = m[F::shm_big];
    // A one-chunk shm all-reduce costs three counter hand-offs after the fixed cost (of a
    // plan's call, which the node measurement, outside a plan, does not pay; the floor below
    // keeps it from vanishing).
    cm.shm_alpha = std::max(std::max(tiny_t - cm.call, 0.25 * tiny_t) / 3, 1e-9);
    // Per byte: the big run without the fixed cost and its chunks' counter hand-offs.
    cm.shm_chunk = static_cast<double>(shm_chunk_bytes(static_cast<std::size_t>(m[F::slot_bytes])));
    const double chunks = std::ceil(big / cm.shm_chunk);
    cm.shm_beta =
        std::max(std::max(big_t - cm.call - 3 * chunks * cm.shm_alpha, 0.5 * big_t) / big, 1e-13);
  }
  if (m[F::copy_cache] > 0 && m[F::copy_memory] > 0 && m[F::knee] > 0) {
    cm.cache_bytes = m[F::knee];
    cm.cache_ranks = static_cast<int>(m[F::machine_ranks]);
    cm.mem_factor = std::max(m[F::copy_memory] / m[F::copy_cache], 1.0);
  }
  return cm;
}

/// The model's measurements over a communicator's transport (collective: every rank runs
/// run() at the same point). Used once, by calibrate().
template <class Transport>
class ModelMeasurement : CalibrationStep<Transport> {
  using Base = CalibrationStep<Transport>;
  using Base::agree_max;
  using Base::allreduce_spec;
  using Base::p_;
  using Base::r_;
  using Base::sample;
  using Base::st_;
  using Base::t_;
  using Base::wait;
  using typename Base::Plan;

 public:
  explicit ModelMeasurement(CommState<Transport>& st) : Base(st) {}

  /// Measures, agrees and fits (collective).
  CostModel run() {
    constexpr int kTag = 32767;  // above every plan channel's tag (detail::channel_tag)
    constexpr std::size_t big = kModelBytes;
    const int partner = r_ ^ 1;
    const bool paired = partner < p_;
    const Deadline deadline(st_.config.timeout_s);
    typename Transport::Request a, b;
    std::uint64_t words[2] = {0, 0};
    ScopedRegistration<Transport> word_reg(t_, words, sizeof(words));
    auto* word = static_cast<std::uint64_t*>(word_reg.region().data);
    std::vector<unsigned char> sbuf(big, 1), rbuf(big);
    ScopedRegistration<Transport> sreg(t_, sbuf.data(), big), rreg(t_, rbuf.data(), big);
    std::vector<float> x(big / sizeof(float), 1.0f), y(big / sizeof(float), 2.0f);

    auto ping_pong = [&](int peer) {
      if (r_ < peer) {
        t_.isend(a, peer, kTag, word, 8);
        wait(a, deadline, peer);
        t_.irecv(b, peer, kTag, word + 1, 8);
        wait(b, deadline, peer);
      } else {
        t_.irecv(b, peer, kTag, word + 1, 8);
        wait(b, deadline, peer);
        t_.isend(a, peer, kTag, word, 8);
        wait(a, deadline, peer);
      }
    };
    auto exchange = [&](int peer) {
      t_.irecv(b, peer, kTag, rreg.region().data, big);
      t_.isend(a, peer, kTag, sreg.region().data, big);
      wait(b, deadline, peer);
      wait(a, deadline, peer);
    };
    // Half a ping-pong (minimum of a burst) and one exchange with `peer`, as samples qa, qb.
    auto pair_round = [&](int peer, int round, CalibrationQuantity qa, CalibrationQuantity qb,
                          std::vector<double>& sa, std::vector<double>& sb) {
      double best = 1e30;
      for (int i = 0; i < 12; ++i) {
        const double t0 = now_seconds();
        ping_pong(peer);
        best = std::min(best, now_seconds() - t0);
      }
      sa.push_back(sample(qa, round, best / 2));
      const double t0 = now_seconds();
      exchange(peer);
      sb.push_back(sample(qb, round, now_seconds() - t0));
    };
    // Between nodes: the first rank of node 2k with the first rank of node 2k+1.
    const NodeMap nodes = node_map_of(t_);
    const bool multi = nodes.nodes() > 1;
    int inter = -1;
    if (multi && nodes.local_rank(r_) == 0 && (nodes.node_of(r_) ^ 1) < nodes.nodes())
      inter = nodes.members(nodes.node_of(r_) ^ 1).front();
    // ... and every rank with the rank of the same local number there, all pairs at once, where
    // nodes have several ranks: how far the node's links (or cores) are shared (inter_share).
    int cross = -1;
    if (multi && nodes.shape().max_ranks_per_node > 1 && (nodes.node_of(r_) ^ 1) < nodes.nodes()) {
      const std::vector<int>& there = nodes.members(nodes.node_of(r_) ^ 1);
      const auto l = static_cast<std::size_t>(nodes.local_rank(r_));
      if (l < there.size()) cross = there[l];
    }

    // The fixed cost of a call: a one-element rd all-reduce, whose steps the model prices.
    float one[1] = {1.0f};
    Plan call_plan(st_, allreduce_spec(AllreduceAlgorithm::rd, DType::f32, one, one, 1));
    // Cache against memory: a node's first rank copies working sets from 8 to 64 MiB (see
    // kCopyFirstBytes), skipped where the probes are limited below 4 MiB (tests). The two
    // buffers are the calibration's largest allocation, made while the model and optimizer state
    // already exist: a rank's peak memory grows by 2 * kCopyMaxBytes at most.
    const bool copier = nodes.local_rank(r_) == 0 && calibration_probe_limit() >= big;
    const std::size_t mem_bytes = copier ? kCopyMaxBytes : 0;
    std::vector<unsigned char> mem_src(mem_bytes, 1), mem_dst(mem_bytes, 0);
    std::vector<std::size_t> copy_sizes;  // bytes copied, each a working set of twice that
    for (std::size_t n = kCopyFirstBytes; copier && n <= kCopyMaxBytes; n *= 2)
      copy_sizes.push_back(n);
    std::vector<std::vector<double>> s_copies(copy_sizes.size());

    // The shm all-reduce: over the whole group where it shares segments (one node); with
    // several nodes, among the ranks of each node on the node's segments, which is what hier and
    // hier_leader pay inside a node (a rank alone on its node measures nothing, the agreement
    // takes the other nodes' figures).
    SharedSegments* const seg = shared_segments_of(t_);
    SharedSegments* const node_seg =
        !seg && multi && nodes.node_size(nodes.node_of(r_)) > 1 ? node_segments_of(t_) : nullptr;
    SharedSegments* const shm_seg = seg ? seg : node_seg;
    CalibrationFloats v(calibration_allocator(shm_seg), shm_seg ? big / sizeof(float) : 0, 1.0f);
    float tiny[8] = {};
    std::unique_ptr<Plan> big_plan, tiny_plan;
    NodeShm node_big, node_tiny;
    if (seg) {
      big_plan = std::make_unique<Plan>(
          st_, allreduce_spec(AllreduceAlgorithm::shm, DType::f32, v.data(), v.data(), v.size()));
      tiny_plan = std::make_unique<Plan>(
          st_, allreduce_spec(AllreduceAlgorithm::shm, DType::f32, tiny, tiny, 8));
    } else if (node_seg) {
      node_big = node_shm(nodes, node_seg, v.data(), v.size());
      node_tiny = node_shm(nodes, node_seg, tiny, 8);
    }
    auto run_big = [&] { big_plan ? execute_in_order(st_, *big_plan) : node_big.run(st_); };
    auto run_tiny = [&] { tiny_plan ? execute_in_order(st_, *tiny_plan) : node_tiny.run(st_); };
    // Warm-up, unmeasured: connections, first touch of every buffer and segment.
    if (paired) {
      ping_pong(partner);
      exchange(partner);
    }
    if (inter >= 0) {
      ping_pong(inter);
      exchange(inter);
    }
    if (cross >= 0) exchange(cross);
    host::reduce(ReduceOp::sum, x.data(), x.data(), y.data(), x.size());
    execute_in_order(st_, call_plan);
    if (shm_seg) {
      run_big();
      run_tiny();
    }

    std::vector<double> s_alpha, s_beta, s_gamma, s_shm_alpha, s_shm_beta, s_inter_alpha,
        s_inter_beta, s_inter_shared, s_call;
    for (int round = 0; round < kRounds; ++round) {
      if (paired)
        pair_round(partner, round, CalibrationQuantity::alpha, CalibrationQuantity::beta, s_alpha,
                   s_beta);
      {
        const double t0 = now_seconds();
        host::reduce(ReduceOp::sum, x.data(), x.data(), y.data(), x.size());
        s_gamma.push_back(sample(CalibrationQuantity::gamma, round, now_seconds() - t0));
      }
      {
        double best = 1e30;
        for (int i = 0; i < 12; ++i) {
          const double t0 = now_seconds();
          execute_in_order(st_, call_plan);
          best = std::min(best, now_seconds() - t0);
        }
        s_call.push_back(
            sample(CalibrationQuantity::call, round, best, AllreduceAlgorithm::rd, sizeof(one)));
      }
      // Between nodes, right after the all-reduces above: the nodes' first ranks alone, as
      // hier_leader's leaders run, with no memory of the contention that the all-reduces of
      // all ranks left, while the other ranks of each node wait for theirs in an shm all-reduce
      // on the node's segments, blocked in the kernel as hier_leader's do; then every rank with
      // its counterpart, the pairs starting together after one more all-reduce. (Measured
      // while the others polled in an all-reduce over the transport and with the memory left
      // set, which paces MPI's waits with sleeps: on 2x2 fake nodes a 4 MiB exchange took
      // 3.2-5.6 ms instead of 0.6-1.0; benchmarks/RESULTS.md.)
      if (multi) {
        if (inter >= 0) {
          forget_contention();
          pair_round(inter, round, CalibrationQuantity::inter_alpha,
                     CalibrationQuantity::inter_beta, s_inter_alpha, s_inter_beta);
        }
        if (node_seg) run_tiny();
        execute_in_order(st_, call_plan);
        if (cross >= 0) {
          const double t0 = now_seconds();
          exchange(cross);
          s_inter_shared.push_back(
              sample(CalibrationQuantity::inter_shared, round, now_seconds() - t0));
        }
      }
      if (copier && round < kCopyRounds) {
        for (std::size_t i = 0; i < copy_sizes.size(); ++i) {
          // The same copy three times, the faster of the last two timed: what fits the cache is
          // then in it.
          const std::size_t n = copy_sizes[i];
          std::memcpy(mem_dst.data(), mem_src.data(), n);
          double best = 1e30;
          for (int rep = 0; rep < 2; ++rep) {
            const double t0 = now_seconds();
            std::memcpy(mem_dst.data(), mem_src.data(), n);
            best = std::min(best, now_seconds() - t0);
          }
          const double per_byte = best / double(n);
          const CalibrationQuantity q =
              i == 0 ? CalibrationQuantity::copy_cache : CalibrationQuantity::copy_memory;
          s_copies[i].push_back(sample(q, round, per_byte, AllreduceAlgorithm::ring, 2 * n));
        }
      }
      if (shm_seg) {
        double best = 1e30;
        for (int i = 0; i < 12; ++i) {
          const double t0 = now_seconds();
          run_tiny();
          best = std::min(best, now_seconds() - t0);
        }
        s_shm_alpha.push_back(sample(CalibrationQuantity::shm_alpha, round, best,
                                     AllreduceAlgorithm::shm, sizeof(tiny)));
        std::fill(v.begin(), v.end(), 1.0f);
        const double t0 = now_seconds();
        run_big();
        s_shm_beta.push_back(sample(CalibrationQuantity::shm_beta, round, now_seconds() - t0,
                                    AllreduceAlgorithm::shm, big));
      }
      // A pause between rounds spreads them in time, so one burst of load hits few of them.
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // Each copy's median per byte, and where this node's copies left the cache, as a working
    // set (a node's first rank; none elsewhere).
    std::vector<double> copy_ws, copy_per_byte;
    for (std::size_t i = 0; i < copy_sizes.size(); ++i) {
      copy_ws.push_back(2.0 * static_cast<double>(copy_sizes[i]));
      copy_per_byte.push_back(median_of(s_copies[i]));
    }
    // Medians, agreed (maximum over ranks), then the fit: every rank fits the same numbers.
    // The leaders' exchange between nodes takes its fastest round instead: with the other ranks
    // of the nodes blocked it is a single pair's transfer, which a disturbance (another rank
    // scheduled onto its cores) only slows. On 2x2 fake nodes its median of 5 rounds came out at
    // either 0.18-0.32 or 0.80-1.01 ns/B between runs, and the model's choice between hier and
    // hier_leader from 64 KiB up followed it; the fastest round gave 0.12-0.23 in 14 of 15
    // runs, where the bench times hier_leader faster (benchmarks/RESULTS.md).
    ModelFigures f;
    f.v = {median_of(s_alpha),
           median_of(s_beta),
           median_of(s_gamma),
           median_of(s_shm_alpha),
           median_of(s_shm_beta),
           median_of(s_inter_alpha),
           fastest_of(s_inter_beta),
           median_of(s_call),
           copier ? copy_per_byte.front() : 0.0,
           copier ? copy_per_byte.back() : 0.0,
           static_cast<double>(nodes.max_machine_ranks()),
           cache_knee(copy_ws, copy_per_byte),
           static_cast<double>(shm_seg ? shm_seg->slot_bytes : 0),
           median_of(s_inter_shared)};
    agree_max(f.v.data(), f.v.size());
    return fit_model(f, p_, multi);
  }

 private:
  /// An shm all-reduce of `count` f32 in place on `data` among the ranks of this rank's node,
  /// on the node's segments `seg`, outside any plan (what hier and hier_leader pay inside a
  /// node).
  struct NodeShm {
    std::unique_ptr<PlanContext<Transport>> root, view;
    std::unique_ptr<ShmAlgorithm<Transport>> algo;
    void run(CommState<Transport>& st) {
      root->begin(st.seq.load());
      algo->run();
    }
  };
  NodeShm node_shm(const NodeMap& nodes, SharedSegments* seg, float* data, std::size_t count) {
    NodeShm n;
    n.root = std::make_unique<PlanContext<Transport>>(
        st_, allreduce_spec(AllreduceAlgorithm::shm, DType::f32, data, data, count));
    n.view =
        std::make_unique<PlanContext<Transport>>(*n.root, nodes.members(nodes.node_of(r_)), count,
                                                 ReduceOp::sum, kFirstAlgorithmChannel, 0, seg);
    n.algo = std::make_unique<ShmAlgorithm<Transport>>(*n.view, data, data);
    return n;
  }
};

}  // namespace dtrain::detail
