// dtrain: measuring the alpha-beta-gamma cost model (Communicator::cost_model). Collective.
//
// Ranks pair up (r, r^1) for a ping-pong (alpha) and a 4 MiB exchange (beta), time a local 4 MiB
// reduction (gamma), time a one-chunk and a 4 MiB shm all-reduce when the transport has
// node-shared segments, and agree on the maximum of each so that every rank selects alike. The
// buffers of the point-to-point measurements are registered with the transport first, as a plan
// registers its own, so that a transport which requires registration is measured as it is used.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <dtrain/comm/collective_plan.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Memory registered with a transport for the lifetime of this object.
template <class Transport>
class ScopedRegistration {
 public:
  ScopedRegistration(Transport& t, void* data, std::size_t bytes)
      : t_(&t), region_(t.register_memory(data, bytes, Space::host)) {}
  ~ScopedRegistration() { t_->deregister_memory(region_); }
  ScopedRegistration(const ScopedRegistration&) = delete;
  ScopedRegistration& operator=(const ScopedRegistration&) = delete;
  const MemoryRegion& region() const noexcept { return region_; }

 private:
  Transport* t_;
  MemoryRegion region_;
};

/// Measures the model over `st`'s transport (collective: every rank calls it at the same point of
/// its collective sequence; queued collectives are drained first).
template <class Transport>
CostModel measure_cost_model(CommState<Transport>& st) {
  using Plan = PlanImpl<Transport>;
  auto make_spec = [](CollectiveKind k) {
    PlanSpec s;
    s.kind = k;
    return s;
  };
  st.engine.drain();
  // The calibration is a collective of its own, so its fingerprint keeps ranks in step.
  {
    Plan cal(st, make_spec(CollectiveKind::calibrate));
    execute_in_order(st, cal);
  }
  Transport& t = *st.transport;
  const int r = t.rank(), p = t.size(), partner = r ^ 1;
  constexpr int kTag = 32767;  // above every plan channel's tag (detail::channel_tag)
  double m[3] = {0, 0, 0};
  if (partner < p) {
    const Deadline deadline(st.config.timeout_s);
    typename Transport::Request a, b;
    auto wait = [&](typename Transport::Request& q) {
      if (!t.wait_until(q, deadline))
        raise<TimeoutError>(
            "cost-model calibration",
            concat("wait for rank ", partner, " timed out after ", deadline.budget(), " s"));
    };
    std::uint64_t words[2] = {0, 0};
    ScopedRegistration<Transport> word_reg(t, words, sizeof(words));
    auto* word = static_cast<std::uint64_t*>(word_reg.region().data);
    double best = 1e30;
    // The minimum over bursts spread in time: on a shared machine a partner descheduled for a
    // whole burst would otherwise pass for latency.
    for (int i = 0; i < 68; ++i) {
      if (i % 16 == 15) std::this_thread::sleep_for(std::chrono::microseconds(200));
      const double t0 = now_seconds();
      if (r < partner) {
        t.isend(a, partner, kTag, word, 8);
        wait(a);
        t.irecv(b, partner, kTag, word + 1, 8);
        wait(b);
      } else {
        t.irecv(b, partner, kTag, word + 1, 8);
        wait(b);
        t.isend(a, partner, kTag, word, 8);
        wait(a);
      }
      if (i >= 3) best = std::min(best, now_seconds() - t0);
    }
    m[0] = best / 2;
    // Beyond the caches, so that beta describes the bandwidth-bound regime it is used for.
    constexpr std::size_t big = 4 << 20;
    std::vector<unsigned char> sbuf(big, 1), rbuf(big);
    ScopedRegistration<Transport> sreg(t, sbuf.data(), big), rreg(t, rbuf.data(), big);
    best = 1e30;
    for (int i = 0; i < 6; ++i) {
      const double t0 = now_seconds();
      t.irecv(b, partner, kTag, rreg.region().data, big);
      t.isend(a, partner, kTag, sreg.region().data, big);
      wait(b);
      wait(a);
      if (i >= 1) best = std::min(best, now_seconds() - t0);
    }
    m[1] = std::max((best - m[0]) / static_cast<double>(big), 1e-13);
  }
  double shm[2] = {0, 0};  // counter hand-off seconds, shm seconds per byte
  {
    std::vector<float> x(1 << 20, 1.0f), y(1 << 20, 2.0f);  // 4 MiB each, as for beta
    double best = 1e30;
    for (int i = 0; i < 4; ++i) {
      const double t0 = now_seconds();
      host::reduce(ReduceOp::sum, x.data(), x.data(), y.data(), x.size());
      best = std::min(best, now_seconds() - t0);
    }
    m[2] = best / static_cast<double>(x.size() * sizeof(float));
  }
  const bool has_shm = shared_segments_of(t) != nullptr;
  if (has_shm) {
    // The fingerprint exchange every collective pays (ceil(log2 p) message rounds) is left out
    // of every algorithm's model alike, so it is taken out of these timings.
    int rounds = 0;
    for (int d = 1; d < p; d <<= 1) ++rounds;
    const double check = st.config.check_fingerprints ? rounds * m[0] : 0.0;
    PlanSpec s = make_spec(CollectiveKind::allreduce);
    s.dtype = DType::f32;
    s.algo = AllreduceAlgorithm::shm;
    // A bandwidth-bound shm all-reduce (4 MiB, as for beta), first: it also warms the segments
    // up for the latency measurement below.
    constexpr std::size_t big_count = 1 << 20;
    std::vector<float> v(big_count, 1.0f);
    s.count = big_count;
    s.in = v.data();
    s.out = v.data();
    double big_best = 1e30;
    {
      Plan big_plan(st, s);
      for (int i = 0; i < 5; ++i) {
        std::fill(v.begin(), v.end(), 1.0f);
        const double t0 = now_seconds();
        execute_in_order(st, big_plan);
        if (i >= 1) big_best = std::min(big_best, now_seconds() - t0);
      }
    }
    // A one-chunk shm all-reduce costs three counter hand-offs.
    float tiny[8] = {};
    s.count = 8;
    s.in = tiny;
    s.out = tiny;
    double best = 1e30;
    {
      Plan plan(st, s);
      for (int i = 0; i < 132; ++i) {
        if (i % 16 == 15) std::this_thread::sleep_for(std::chrono::microseconds(200));
        const double t0 = now_seconds();
        execute_in_order(st, plan);
        if (i >= 3) best = std::min(best, now_seconds() - t0);
      }
    }
    shm[0] = std::max(best - check, 0.25 * best) / 3;
    // Per byte: the big run without its chunks' counter hand-offs.
    const double bytes = static_cast<double>(big_count * sizeof(float));
    const double chunks = std::ceil(bytes / static_cast<double>(shared_segments_of(t)->slot_bytes));
    shm[1] = std::max(big_best - check - 3 * chunks * shm[0], 0.5 * big_best) / bytes;
  }
  double agreed[5] = {m[0], m[1], m[2], shm[0], shm[1]};
  PlanSpec s = make_spec(CollectiveKind::allreduce);
  s.op = ReduceOp::max;
  s.dtype = DType::f64;
  s.count = 5;
  s.in = agreed;
  s.out = agreed;
  s.algo = AllreduceAlgorithm::rd;
  {
    Plan agree(st, s);
    execute_in_order(st, agree);
  }
  CostModel cm{std::max(agreed[0], 1e-9), std::max(agreed[1], 1e-13), agreed[2]};
  if (has_shm) {
    cm.shm_alpha = std::max(agreed[3], 1e-9);
    cm.shm_beta = std::max(agreed[4], 1e-13);
    cm.shm_chunk = static_cast<double>(shared_segments_of(t)->slot_bytes);
  }
  return cm;
}

}  // namespace dtrain::detail
