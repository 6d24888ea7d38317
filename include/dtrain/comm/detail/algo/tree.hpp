// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the pipelined double binary tree all-reduce. Tree 0 is an in-order binary tree over
// positions 1..p-1 (node x with lowest set bit b has children x-b/2 and x+b/2, or the next smaller
// offset that exists) hung below position 0; odd positions are its leaves. Tree 1 maps positions
// to ranks shifted by one (p even) or mirrored (p odd), which turns the leaves of tree 0 into the
// interior nodes of tree 1. Each tree carries half the data, segment by segment, up (reduce) and
// down (broadcast) at once; since a rank is interior in (about) one tree only, it moves about N up
// and N down in total: bandwidth close to the ring's with O(log p) instead of O(p) latency.
// Channel ids: (tree, direction, segment).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include <dtrain/comm/detail/algo/context.hpp>

namespace dtrain::detail {

/// Positions of one rank in the two trees of the double binary tree.
struct TreeLinks {
  int parent = -1;
  int children[2] = {-1, -1};
  int nchildren = 0;
};

/// Children of position y in the in-order binary tree over positions 0..p-1 (0 is the root
/// with a single child, the largest power of two below p).
inline int tree_children(int y, int p, int out[2]) {
  int n = 0;
  if (p <= 1) return 0;
  if (y == 0) {
    int top = 1;
    while (top * 2 <= p - 1) top *= 2;
    out[n++] = top;
    return n;
  }
  const int lb = y & -y;
  if (lb >= 2) {
    out[n++] = y - lb / 2;
    for (int s = lb / 2; s >= 1; s /= 2)
      if (y + s < p) {
        out[n++] = y + s;
        break;
      }
  }
  return n;
}

inline int tree_rank_of(int tree, int pos, int p) {
  if (tree == 0) return pos;
  return p % 2 == 0 ? (pos + 1) % p : p - 1 - pos;
}
inline int tree_pos_of(int tree, int rank, int p) {
  if (tree == 0) return rank;
  return p % 2 == 0 ? (rank - 1 + p) % p : p - 1 - rank;
}

/// Links of `rank` in tree `tree` (0 or 1) of the double binary tree over p ranks.
inline TreeLinks tree_links(int tree, int rank, int p) {
  TreeLinks l;
  const int me = tree_pos_of(tree, rank, p);
  int kids[2];
  l.nchildren = tree_children(me, p, kids);
  for (int i = 0; i < l.nchildren; ++i) l.children[i] = tree_rank_of(tree, kids[i], p);
  for (int y = 0; y < p && me != 0; ++y) {
    int c[2];
    const int n = tree_children(y, p, c);
    for (int i = 0; i < n; ++i)
      if (c[i] == me) l.parent = tree_rank_of(tree, y, p);
  }
  return l;
}

template <class Transport>
class TreeAlgorithm : public Algorithm {
  using uchar = unsigned char;
  static constexpr std::size_t kWindow = 4;  // child receives in flight per tree and child

 public:
  TreeAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out)
      : ctx_(ctx), in_(static_cast<const uchar*>(in)), out_(static_cast<uchar*>(out)) {
    const std::size_t n = ctx.spec().count, es = ctx.elem_bytes();
    const int p = ctx.size(), r = ctx.rank();
    half_ = block_begin(n, 2, 1);
    nseg_ = std::max<std::size_t>(
        1, ceil_div(n - half_ > half_ ? n - half_ : half_, ctx.segment_elems()));
    int depth = 0;
    while ((1 << depth) < p) ++depth;
    lag_ = 2 * depth + 2;
    for (int k = 0; k < 2; ++k) links_[k] = tree_links(k, r, p);
    slot_elems_ = std::min(ctx.segment_elems(), std::max<std::size_t>(1, half_));
    if (n == 0) return;
    slots_ = ctx.scratch(2 * 2 * kWindow * slot_elems_ * es);
    down_posted_.assign(2 * nseg_, 0);
    for (int k = 0; k < 2; ++k) {
      const TreeLinks& L = links_[k];
      base_[k] = ctx.channel_count();
      auto id = [&](int dir, std::size_t c) {
        return kFirstAlgorithmChannel + static_cast<int>((k * 2 + dir) * nseg_ + c);
      };
      for (int ch = 0; ch < 2; ++ch)
        for (std::size_t c = 0; c < nseg_; ++c) {
          std::size_t off, len;
          seg(k, c, off, len);
          const bool has = ch < L.nchildren;
          ctx.add_recv(has ? L.children[ch] : -1, id(0, c), slot(k, ch, c), has ? len * es : 0);
        }
      for (std::size_t c = 0; c < nseg_; ++c) {
        std::size_t off, len;
        seg(k, c, off, len);
        const uchar* src = (L.nchildren ? out_ : in_) + off * es;
        ctx.add_send(L.parent, id(0, c), src, L.parent >= 0 ? len * es : 0);
      }
      for (std::size_t c = 0; c < nseg_; ++c) {
        std::size_t off, len;
        seg(k, c, off, len);
        ctx.add_recv(L.parent, id(1, c), out_ + off * es, L.parent >= 0 ? len * es : 0);
      }
      for (int ch = 0; ch < 2; ++ch)
        for (std::size_t c = 0; c < nseg_; ++c) {
          std::size_t off, len;
          seg(k, c, off, len);
          const bool has = ch < L.nchildren;
          ctx.add_send(has ? L.children[ch] : -1, id(1, c), out_ + off * es, has ? len * es : 0);
        }
    }
  }

  void run() override {
    if (ctx_.spec().count == 0) return;
    const std::size_t nseg = nseg_, W = kWindow, es = ctx_.elem_bytes();
    auto post_child = [&](int k, int ch, std::size_t c) {
      if (c < nseg) ctx_.start(child_recv(k, ch, c));
    };
    // Whether this rank's upward message for the segment was read from `out` (then the
    // downward receive into `out` must wait for it).
    auto sends_from_out = [&](int k) { return links_[k].nchildren > 0 || in_ == out_; };
    auto up = [&](int k, std::size_t c) {
      const TreeLinks& L = links_[k];
      std::size_t off, len;
      seg(k, c, off, len);
      const uchar* src = in_ + off * es;
      uchar* dst = out_ + off * es;
      for (int ch = 0; ch < L.nchildren; ++ch) {
        ctx_.wait(child_recv(k, ch, c));
        if (len) ctx_.reduce(dst, ch == 0 ? src : dst, slot(k, ch, c), len);
        post_child(k, ch, c + W);
      }
      if (L.parent < 0) {
        if (len && L.nchildren == 0 && src != dst) std::memcpy(dst, src, len * es);
        if (len) ctx_.finish_avg(dst, len);
        for (int ch = 0; ch < L.nchildren; ++ch) ctx_.start(down_send(k, ch, c));
      } else {
        ctx_.start(up_send(k, c));
      }
    };
    auto post_down = [&](int k, std::size_t c) {
      const TreeLinks& L = links_[k];
      if (L.parent < 0 || down_posted_[k * nseg + c]) return;
      if (sends_from_out(k)) ctx_.wait(up_send(k, c));
      ctx_.start(down_recv(k, c));
      down_posted_[k * nseg + c] = 1;
    };
    auto down = [&](int k, std::size_t c) {
      const TreeLinks& L = links_[k];
      if (L.parent < 0) return;
      post_down(k, c);
      ctx_.wait(down_recv(k, c));
      for (int ch = 0; ch < L.nchildren; ++ch) ctx_.start(down_send(k, ch, c));
    };
    std::fill(down_posted_.begin(), down_posted_.end(), 0);
    for (int k = 0; k < 2; ++k)
      for (int ch = 0; ch < links_[k].nchildren; ++ch)
        for (std::size_t c = 0; c < std::min(W, nseg); ++c) post_child(k, ch, c);
    for (std::size_t it = 0; it < nseg + lag_; ++it) {
      // The tree in which this rank is a leaf first: its upward send needs nothing, and the
      // partner may be waiting for exactly it. Taken the other way round at p = 2 (each rank the
      // root of one tree and the leaf of the other), both ranks first waited as roots, so the
      // two halves crossed one after the other instead of at once (tree at 1 MiB ran at a third
      // of ring's speed, benchmarks/RESULTS.md).
      if (it < nseg)
        for (int pass = 0; pass < 2; ++pass)
          for (int k = 0; k < 2; ++k)
            if ((links_[k].nchildren == 0) == (pass == 0)) up(k, it);
      if (it >= 1 && it - 1 < nseg)
        for (int k = 0; k < 2; ++k) post_down(k, it - 1);
      if (it >= lag_ && it - lag_ < nseg)
        for (int k = 0; k < 2; ++k) down(k, it - lag_);
    }
    for (int k = 0; k < 2; ++k) {
      for (std::size_t c = 0; c < nseg; ++c) {
        ctx_.wait(up_send(k, c));
        for (int ch = 0; ch < links_[k].nchildren; ++ch) ctx_.wait(down_send(k, ch, c));
      }
    }
  }

 private:
  // Per tree: child receives (2 x nseg), up sends, down receives, down sends (2 x nseg).
  std::size_t child_recv(int k, int ch, std::size_t c) const noexcept {
    return base_[k] + ch * nseg_ + c;
  }
  std::size_t up_send(int k, std::size_t c) const noexcept { return base_[k] + 2 * nseg_ + c; }
  std::size_t down_recv(int k, std::size_t c) const noexcept { return base_[k] + 3 * nseg_ + c; }
  std::size_t down_send(int k, int ch, std::size_t c) const noexcept {
    return base_[k] + (4 + ch) * nseg_ + c;
  }
  uchar* slot(int k, int ch, std::size_t c) const noexcept {
    return slots_ + (((k * 2 + ch) * kWindow + c % kWindow) * slot_elems_) * ctx_.elem_bytes();
  }
  void seg(int k, std::size_t c, std::size_t& off, std::size_t& len) const noexcept {
    const std::size_t n = ctx_.spec().count;
    const std::size_t base = k ? half_ : 0, total = k ? n - half_ : half_;
    off = base + block_begin(total, nseg_, c);
    len = base + block_begin(total, nseg_, c + 1) - off;
  }

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* out_;
  TreeLinks links_[2];
  std::size_t half_ = 0, nseg_ = 1, lag_ = 2, slot_elems_ = 1;
  std::size_t base_[2] = {0, 0};
  uchar* slots_ = nullptr;
  std::vector<char> down_posted_;
};

}  // namespace dtrain::detail
