// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the ring algorithms. All-reduce is a reduce-scatter then an all-gather around the ring
// r -> r+1, 2(p-1) steps; reduce_scatter and allgather are its two halves. Each block is cut into
// segments; a segment is reduced as soon as it arrives and forwarded at once, so the reduction of
// one segment overlaps the transfer of the next (software pipeline).
//
// Rank r owns block r after the reduce-scatter steps. Step t < p-1 sends block r-t-1 and receives
// block r-t-2; all-gather step s sends block r-s and receives block r-s-1. The message of step t,
// segment c has channel id t * segments + c on both ends.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <dtrain/comm/detail/algo/context.hpp>

namespace dtrain::detail {

template <class Transport>
class RingAlgorithm : public Algorithm {
  using uchar = unsigned char;

 public:
  /// `in`: this rank's contribution (reduce-scatter steps read it once); `work`: the full vector
  /// the steps reduce into and gather in (may be `in`: then received segments land in two
  /// alternating block-sized buffers first). rs / ag select the halves.
  RingAlgorithm(PlanContext<Transport>& ctx, const void* in, void* work, bool rs, bool ag)
      : ctx_(ctx),
        in_(static_cast<const uchar*>(in)),
        work_(static_cast<uchar*>(work)),
        trs_(rs ? ctx.size() - 1 : 0),
        steps_(trs_ + (ag ? ctx.size() - 1 : 0)) {
    const std::size_t n = ctx.spec().count, es = ctx.elem_bytes();
    const int p = ctx.size(), r = ctx.rank();
    max_block_ = ceil_div(n, static_cast<std::size_t>(p));
    nseg_ = std::max<std::size_t>(1, ceil_div(max_block_, ctx.segment_elems()));
    if (steps_ == 0 || n == 0) return;
    const bool inplace = in_ == work_;
    if (inplace && trs_ > 0) tmp_ = ctx.scratch(2 * max_block_ * es);
    const int left = ctx.mod_p(r - 1), right = ctx.mod_p(r + 1);
    for (int t = 0; t < steps_; ++t) {
      for (std::size_t c = 0; c < nseg_; ++c) {
        const int id = kFirstAlgorithmChannel + static_cast<int>(t * nseg_ + c);
        std::size_t off, len;
        seg_of_block(recv_block(t), c, off, len);
        uchar* dst = (t < trs_ && inplace) ? tmp_ptr(t, recv_block(t), off) : work_ + off * es;
        const std::size_t ri = ctx.add_recv(left, id, dst, len * es);
        seg_of_block(send_block(t), c, off, len);
        const uchar* src = (t == 0 && trs_ > 0) ? in_ : work_;
        const std::size_t si = ctx.add_send(right, id, src + off * es, len * es);
        if (t == 0 && c == 0) first_ = ri;
        DTRAIN_ASSERT(ri == first_ + 2 * (t * nseg_ + c) && si == ri + 1);
      }
    }
  }

  void run() override {
    if (steps_ == 0 || ctx_.spec().count == 0) return;
    const int p = ctx_.size();
    const std::size_t nseg = nseg_, es = ctx_.elem_bytes();
    const bool inplace = in_ == work_;
    for (std::size_t c = 0; c < nseg; ++c) ctx_.start(recv(0, c));
    for (std::size_t c = 0; c < nseg; ++c) ctx_.start(send(0, c));
    for (int t = 0; t < steps_; ++t) {
      for (std::size_t c = 0; c < nseg; ++c) {
        ctx_.wait(recv(t, c));
        if (t < trs_) {
          const int b = recv_block(t);
          std::size_t off, len;
          seg_of_block(b, c, off, len);
          if (len) {
            uchar* dst = work_ + off * es;
            const uchar* other = inplace ? tmp_ptr(t, b, off) : in_ + off * es;
            ctx_.reduce(dst, dst, other, len);
            if (t == trs_ - 1) ctx_.finish_avg(dst, len);
          }
        }
        if (t + 1 < steps_) {
          // With two ranks the next receive lands where this step's send reads from.
          if (p == 2) ctx_.wait(send(t, c));
          ctx_.start(recv(t + 1, c));
          if (t >= 1) ctx_.wait(send(t - 1, c));  // at most two sends per segment in flight
          ctx_.start(send(t + 1, c));
        }
      }
    }
    for (std::size_t c = 0; c < nseg; ++c) {
      ctx_.wait(send(steps_ - 1, c));
      if (steps_ >= 2) ctx_.wait(send(steps_ - 2, c));
    }
  }

 private:
  std::size_t recv(int t, std::size_t c) const noexcept { return first_ + 2 * (t * nseg_ + c); }
  std::size_t send(int t, std::size_t c) const noexcept { return recv(t, c) + 1; }
  int send_block(int t) const noexcept {
    const int r = ctx_.rank();
    return t < trs_ ? ctx_.mod_p(r - t - 1) : ctx_.mod_p(r - (t - trs_));
  }
  int recv_block(int t) const noexcept {
    const int r = ctx_.rank();
    return t < trs_ ? ctx_.mod_p(r - t - 2) : ctx_.mod_p(r - (t - trs_) - 1);
  }
  void seg_of_block(int b, std::size_t c, std::size_t& off, std::size_t& len) const noexcept {
    const std::size_t n = ctx_.spec().count, p = static_cast<std::size_t>(ctx_.size());
    const std::size_t b0 = block_begin(n, p, b), bl = block_begin(n, p, b + 1) - b0;
    off = b0 + block_begin(bl, nseg_, c);
    len = b0 + block_begin(bl, nseg_, c + 1) - off;
  }
  uchar* tmp_ptr(int t, int b, std::size_t off) const noexcept {
    const std::size_t b0 = block_begin(ctx_.spec().count, ctx_.size(), b);
    return tmp_ + ((t & 1) * max_block_ + (off - b0)) * ctx_.elem_bytes();
  }

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* work_;
  int trs_, steps_;
  std::size_t max_block_ = 0, nseg_ = 1, first_ = 0;
  uchar* tmp_ = nullptr;
};

/// reduce_scatter: the ring's first half over a full-size work buffer, then this rank's block
/// copied to `out` (block-sized).
template <class Transport>
class RingReduceScatter : public Algorithm {
 public:
  RingReduceScatter(PlanContext<Transport>& ctx, const void* in, void* out)
      : ctx_(ctx),
        out_(out),
        work_(ctx.scratch(ctx.spec().count * ctx.elem_bytes())),
        ring_(ctx, in, work_, true, false) {}
  void run() override {
    ring_.run();
    const std::size_t n = ctx_.spec().count, es = ctx_.elem_bytes();
    const std::size_t b0 = block_begin(n, ctx_.size(), ctx_.rank()),
                      b1 = block_begin(n, ctx_.size(), ctx_.rank() + 1);
    if (b1 > b0) std::memcpy(out_, work_ + b0 * es, (b1 - b0) * es);
  }

 private:
  PlanContext<Transport>& ctx_;
  void* out_;
  unsigned char* work_;
  RingAlgorithm<Transport> ring_;
};

/// allgather: this rank's part placed in `out`, then the ring's second half in place.
template <class Transport>
class RingAllgather : public Algorithm {
 public:
  RingAllgather(PlanContext<Transport>& ctx, const void* in, void* out)
      : ctx_(ctx),
        in_(in),
        out_(static_cast<unsigned char*>(out)),
        ring_(ctx, out, out, false, true) {}
  void run() override {
    const std::size_t n = ctx_.spec().count, es = ctx_.elem_bytes();
    const std::size_t b0 = block_begin(n, ctx_.size(), ctx_.rank()),
                      b1 = block_begin(n, ctx_.size(), ctx_.rank() + 1);
    if (b1 > b0 && out_ + b0 * es != in_) std::memmove(out_ + b0 * es, in_, (b1 - b0) * es);
    ring_.run();
  }

 private:
  PlanContext<Transport>& ctx_;
  const void* in_;
  unsigned char* out_;
  RingAlgorithm<Transport> ring_;
};

}  // namespace dtrain::detail
