// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the ordered (bitwise reproducible) algorithms. Every element of the result is
//   ((x_0 (op) x_1) (op) x_2) (op) ... x_{p-1}
// in the widened element type, whatever the timing, the segment size, the transport or which
// algorithm was asked for, and then finished once (avg divides by p, 16-bit floats are rounded
// once by the plan).
//
// Why this design: an algorithm whose reduction tree depends on p only (ring, tree, rhd) is
// already deterministic run after run, but each gives different bits, and the ring's order even
// depends on which block an element falls in, so results changed with the algorithm, the bucket
// size (which moves elements between blocks) and the transport. The one order every algorithm
// can share without extra traffic is rank order at the rank that owns the element: the owner of
// part q receives the p-1 other contributions to it and adds them up in rank order. That is a
// reduce-scatter by direct exchange, n(p-1)/p bytes in and out per rank like the ring's, in p-1
// messages per segment instead of one per step; the all-gather only moves finished bits, so its
// schedule cannot change them (also direct, so all channel ids of the plan are this file's).
// Node-shared segments get the same order from ordered_shm, shm.hpp's ShmAlgorithm with its
// owner adding the p contributions in rank order (the same slots, counters and in-place reads of
// heap buffers as shm). Memory stays bounded: two segments of p-1 receive buffers (double
// buffering).
//
// Channel ids: reduce-scatter segment c is kFirstAlgorithmChannel + c, all-gather segment c is
// kFirstAlgorithmChannel + segments + c; the peer tells the p-1 messages of one segment apart.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include <dtrain/comm/detail/algo/context.hpp>

namespace dtrain::detail {

/// All-reduce (reduce-scatter + all-gather) or reduce-scatter alone in rank order, by messages.
template <class Transport>
class OrderedAlgorithm : public Algorithm {
  using uchar = unsigned char;

 public:
  /// `in`: this rank's full contribution. With `allgather`, `out` is the full result vector (may
  /// be `in`); without, `out` is this rank's block only (reduce_scatter).
  OrderedAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out, bool allgather)
      : ctx_(ctx),
        in_(static_cast<const uchar*>(in)),
        out_(static_cast<uchar*>(out)),
        allgather_(allgather) {
    const std::size_t n = ctx.spec().count, es = ctx.elem_bytes();
    const int p = ctx.size(), r = ctx.rank();
    if (n == 0 || p == 1) return;
    const std::size_t max_block = ceil_div(n, static_cast<std::size_t>(p));
    nseg_ = std::max<std::size_t>(1, ceil_div(max_block, ctx.segment_elems()));
    seg_max_ = ceil_div(max_block, nseg_);
    stage_ = ctx.scratch(2 * static_cast<std::size_t>(p - 1) * seg_max_ * es);
    const std::size_t slots = nseg_ * static_cast<std::size_t>(p - 1);
    rs_recv_.resize(slots);
    rs_send_.resize(slots);
    if (allgather_) {
      ag_recv_.resize(slots);
      ag_send_.resize(slots);
    }
    for (std::size_t c = 0; c < nseg_; ++c) {
      const int rs_id = kFirstAlgorithmChannel + static_cast<int>(c);
      const int ag_id = kFirstAlgorithmChannel + static_cast<int>(nseg_ + c);
      std::size_t off, len;
      seg_of_block(r, c, off, len);
      for (int q = 0; q < p; ++q) {
        if (q == r) continue;
        const std::size_t k = slot(c, q);
        rs_recv_[k] = ctx.add_recv(q, rs_id, stage(c, q), len * es);
        if (allgather_) ag_send_[k] = ctx.add_send(q, ag_id, result(off), len * es);
        std::size_t qoff, qlen;
        seg_of_block(q, c, qoff, qlen);
        rs_send_[k] = ctx.add_send(q, rs_id, in_ + qoff * es, qlen * es);
        if (allgather_) ag_recv_[k] = ctx.add_recv(q, ag_id, out_ + qoff * es, qlen * es);
      }
    }
  }

  void run() override {
    const int p = ctx_.size(), r = ctx_.rank();
    if (nseg_ == 0) return;
    const std::size_t es = ctx_.elem_bytes();
    for (std::size_t c = 0; c < std::min<std::size_t>(2, nseg_); ++c) {
      for_peers(c, [&](std::size_t k) { ctx_.start(rs_recv_[k]); });
      for_peers(c, [&](std::size_t k) { ctx_.start(rs_send_[k]); });
    }
    for (std::size_t c = 0; c < nseg_; ++c) {
      std::size_t off, len;
      seg_of_block(r, c, off, len);
      uchar* dst = result(off);
      const uchar* own = in_ + off * es;
      auto operand = [&](int q) -> const uchar* { return q == r ? own : stage(c, q); };
      // The accumulator: the result itself when this rank's contribution comes first (it may be
      // that contribution, in place), else rank 0's receive buffer until the last addition, so
      // an in-place contribution is read before the result overwrites it.
      uchar* acc = r == 0 ? dst : stage(c, 0);
      for (int q = 0; q < p; ++q) {
        if (q != r) ctx_.wait(rs_recv_[slot(c, q)]);
        if (q == 0 || len == 0) continue;
        const uchar* prev = q == 1 ? operand(0) : acc;
        ctx_.reduce(q == p - 1 ? dst : acc, prev, operand(q), len);
      }
      if (len) ctx_.finish_avg(dst, len);
      if (allgather_) for_peers(c, [&](std::size_t k) { ctx_.start(ag_send_[k]); });
      // In place, the all-gather receives land where the reduce-scatter sends read from.
      for_peers(c, [&](std::size_t k) {
        ctx_.wait(rs_send_[k]);
        if (allgather_) ctx_.start(ag_recv_[k]);
      });
      if (c + 2 < nseg_) {
        for_peers(c + 2, [&](std::size_t k) { ctx_.start(rs_recv_[k]); });
        for_peers(c + 2, [&](std::size_t k) { ctx_.start(rs_send_[k]); });
      }
      // At most two all-gather segments per peer in flight (one-sided transports have few
      // credits per peer).
      if (allgather_ && c >= 2) finish_allgather(c - 2);
    }
    if (!allgather_) return;
    for (std::size_t c = nseg_ >= 2 ? nseg_ - 2 : 0; c < nseg_; ++c) finish_allgather(c);
  }

 private:
  void finish_allgather(std::size_t c) {
    for_peers(c, [&](std::size_t k) {
      ctx_.wait(ag_recv_[k]);
      ctx_.wait(ag_send_[k]);
    });
  }
  // Peers numbered 0..p-2 in rank order, skipping this rank.
  std::size_t peer_index(int q) const noexcept {
    return static_cast<std::size_t>(q < ctx_.rank() ? q : q - 1);
  }
  // Index of (segment c, peer q) in the per-message channel tables.
  std::size_t slot(std::size_t c, int q) const noexcept {
    return c * static_cast<std::size_t>(ctx_.size() - 1) + peer_index(q);
  }
  template <class F>
  void for_peers(std::size_t c, F&& f) {
    for (int q = 0; q < ctx_.size(); ++q)
      if (q != ctx_.rank()) f(slot(c, q));
  }
  // Receive buffer of peer q's contribution to segment c (two segments in flight).
  uchar* stage(std::size_t c, int q) const noexcept {
    return stage_ + ((c & 1) * static_cast<std::size_t>(ctx_.size() - 1) + peer_index(q)) *
                        seg_max_ * ctx_.elem_bytes();
  }
  // Where element `elem` of this rank's block goes.
  uchar* result(std::size_t elem) const noexcept {
    const std::size_t b0 =
        allgather_ ? 0 : block_begin(ctx_.spec().count, ctx_.size(), ctx_.rank());
    return out_ + (elem - b0) * ctx_.elem_bytes();
  }
  void seg_of_block(int b, std::size_t c, std::size_t& off, std::size_t& len) const noexcept {
    const std::size_t n = ctx_.spec().count, p = static_cast<std::size_t>(ctx_.size());
    const std::size_t b0 = block_begin(n, p, b), bl = block_begin(n, p, b + 1) - b0;
    off = b0 + block_begin(bl, nseg_, c);
    len = b0 + block_begin(bl, nseg_, c + 1) - off;
  }

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* out_;
  bool allgather_;
  std::size_t nseg_ = 0, seg_max_ = 0;
  uchar* stage_ = nullptr;
  std::vector<std::size_t> rs_recv_, rs_send_, ag_recv_, ag_send_;
};

}  // namespace dtrain::detail
