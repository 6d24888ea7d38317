// SPDX-License-Identifier: BSD-3-Clause
// dtrain: broadcast along a binomial tree rooted at the root, pipelined by segments: a rank
// forwards each segment to its children as soon as it arrived. Channel id: the segment.
#pragma once

#include <algorithm>
#include <cstddef>

#include <dtrain/comm/detail/algo/context.hpp>

namespace dtrain::detail {

template <class Transport>
class BroadcastAlgorithm : public Algorithm {
 public:
  BroadcastAlgorithm(PlanContext<Transport>& ctx, void* buf) : ctx_(ctx) {
    const std::size_t n = ctx.spec().count, es = ctx.elem_bytes();
    const int p = ctx.size(), root = ctx.spec().root;
    nseg_ = ceil_div(n, ctx.segment_elems());
    const int v = ctx.mod_p(ctx.rank() - root);
    int lowbit = p;  // the root may send along every bit
    for (int m = 1; m < p; m <<= 1)
      if (v & m) {
        parent_ = ctx.mod_p(v - m + root);
        lowbit = m;
        break;
      }
    for (int m = 1; m < lowbit && v + m < p; m <<= 1) kids_.push_back(ctx.mod_p(v + m + root));
    // Send to the child with the largest subtree first.
    std::reverse(kids_.begin(), kids_.end());
    auto* b = static_cast<unsigned char*>(buf);
    first_ = ctx.channel_count();
    for (std::size_t c = 0; c < nseg_; ++c) {
      const std::size_t off = block_begin(n, nseg_, c), len = block_begin(n, nseg_, c + 1) - off;
      const int id = kFirstAlgorithmChannel + static_cast<int>(c);
      ctx.add_recv(parent_, id, b + off * es, parent_ >= 0 ? len * es : 0);
      for (int k : kids_) ctx.add_send(k, id, b + off * es, len * es);
    }
  }

  void run() override {
    const std::size_t per = 1 + kids_.size();
    for (std::size_t c = 0; c < nseg_; ++c) ctx_.start(first_ + c * per);
    for (std::size_t c = 0; c < nseg_; ++c) {
      ctx_.wait(first_ + c * per);
      for (std::size_t k = 0; k < kids_.size(); ++k) ctx_.start(first_ + c * per + 1 + k);
    }
    for (std::size_t k = 0; k < kids_.size(); ++k)
      for (std::size_t c = 0; c < nseg_; ++c) ctx_.wait(first_ + c * per + 1 + k);
  }

 private:
  PlanContext<Transport>& ctx_;
  std::size_t nseg_ = 0, first_ = 0;
  int parent_ = -1;
  std::vector<int> kids_;
};

}  // namespace dtrain::detail
