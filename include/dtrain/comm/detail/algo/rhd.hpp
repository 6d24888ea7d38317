// SPDX-License-Identifier: BSD-3-Clause
// dtrain: recursive halving / doubling (Rabenseifner) all-reduce, for any number of ranks. With
// p' the largest power of two <= p and q = p - p', the first 2q ranks fold pairwise (even sends
// to odd, odd reduces), the p' remaining ranks run recursive halving (reduce-scatter) then
// recursive doubling (all-gather), and the odd ranks hand the result back. Each step is
// segmented so that reduction overlaps arrival. ButterflyAlgorithm (the fold and the segmented
// pairwise exchange) is shared with recursive doubling (rd.hpp).
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include <dtrain/comm/detail/algo/context.hpp>

namespace dtrain::detail {

/// The fold of the non-power-of-two ranks and the pairwise exchange the butterfly algorithms are
/// built from. Channel ids: 0 and 1 (after the first algorithm id) for the fold there and back,
/// then `segments` ids per exchange, numbered in the order both partners run them.
template <class Transport>
class ButterflyAlgorithm : public Algorithm {
 protected:
  using uchar = unsigned char;

  /// One pairwise exchange: send [soff, soff+slen) of a buffer and receive [roff, roff+rlen) of
  /// another from the same partner, both cut into segments.
  struct Exchange {
    int partner = -1;
    std::size_t first = 0;  // channels: nr receives, then ns sends
    std::size_t ns = 0, nr = 0;
    std::size_t roff = 0, rlen = 0;
  };

  ButterflyAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out)
      : ctx_(ctx), in_(static_cast<const uchar*>(in)), out_(static_cast<uchar*>(out)) {
    const int p = ctx.size(), r = ctx.rank();
    count_ = ctx.spec().count;
    butterfly_size_ = 1;
    while (butterfly_size_ * 2 <= p) butterfly_size_ *= 2;
    folded_pairs_ = p - butterfly_size_;
    folded_out_ = r < 2 * folded_pairs_ && r % 2 == 0;
    butterfly_rank_ = r < 2 * folded_pairs_ ? (folded_out_ ? -1 : r / 2) : r - folded_pairs_;
    slots_ = ceil_div(count_, ctx.segment_elems()) + 1;
    if (count_ == 0) return;
    const std::size_t es = ctx.elem_bytes();
    const int fold_id = kFirstAlgorithmChannel;
    if (r < 2 * folded_pairs_) {
      const int partner = folded_out_ ? r + 1 : r - 1;
      if (!folded_out_) tmp_ = ctx.scratch(count_ * es);
      fold_in_ = folded_out_ ? ctx.add_send(partner, fold_id, in_, count_ * es)
                             : ctx.add_recv(partner, fold_id, tmp_, count_ * es);
      fold_back_ = folded_out_ ? ctx.add_recv(partner, fold_id + 1, out_, count_ * es)
                               : ctx.add_send(partner, fold_id + 1, out_, count_ * es);
    } else {
      tmp_ = ctx.scratch(count_ * es);
    }
  }

  /// Rank of the butterfly's virtual rank `vr`.
  int real(int vr) const noexcept { return vr < folded_pairs_ ? 2 * vr + 1 : vr + folded_pairs_; }

  /// Declares exchange number `e` with `partner` (construction).
  Exchange add_exchange(int e, int partner, const uchar* src, std::size_t soff, std::size_t slen,
                        uchar* dst, std::size_t roff, std::size_t rlen) {
    const std::size_t es = ctx_.elem_bytes(), seg = ctx_.segment_elems();
    Exchange x;
    x.partner = partner;
    x.ns = slen ? ceil_div(slen, seg) : 1;
    x.nr = rlen ? ceil_div(rlen, seg) : 1;
    x.roff = roff;
    x.rlen = rlen;
    DTRAIN_ASSERT(x.ns <= slots_ && x.nr <= slots_);
    const int base = kFirstAlgorithmChannel + 2 + e * static_cast<int>(slots_);
    x.first = ctx_.channel_count();
    for (std::size_t c = 0; c < x.nr; ++c) {
      const std::size_t o = block_begin(rlen, x.nr, c), l = block_begin(rlen, x.nr, c + 1) - o;
      ctx_.add_recv(partner, base + static_cast<int>(c), dst + (roff + o) * es, l * es);
    }
    for (std::size_t c = 0; c < x.ns; ++c) {
      const std::size_t o = block_begin(slen, x.ns, c), l = block_begin(slen, x.ns, c + 1) - o;
      ctx_.add_send(partner, base + static_cast<int>(c), src + (soff + o) * es, l * es);
    }
    return x;
  }

  /// Runs an exchange; `on_segment(off, len)` runs as each received segment lands.
  template <class F>
  void run_exchange(const Exchange& x, F&& on_segment) {
    for (std::size_t c = 0; c < x.nr; ++c) ctx_.start(x.first + c);
    for (std::size_t c = 0; c < x.ns; ++c) ctx_.start(x.first + x.nr + c);
    for (std::size_t c = 0; c < x.nr; ++c) {
      const std::size_t o = block_begin(x.rlen, x.nr, c), l = block_begin(x.rlen, x.nr, c + 1) - o;
      ctx_.wait(x.first + c);
      if (l) on_segment(x.roff + o, l);
    }
    for (std::size_t c = 0; c < x.ns; ++c) ctx_.wait(x.first + x.nr + c);
  }

  /// The fold: returns false on a folded-out rank (its result has arrived); otherwise this rank
  /// takes part in the power-of-two butterfly, reading its contribution from the returned
  /// `src` (the input, or `out` holding the folded pair's reduction).
  bool fold(const uchar*& src) {
    src = in_;
    if (ctx_.rank() >= 2 * folded_pairs_) return true;
    if (folded_out_) {
      ctx_.start(fold_in_);
      ctx_.wait(fold_in_);
      ctx_.start(fold_back_);
      ctx_.wait(fold_back_);
      return false;
    }
    ctx_.start(fold_in_);
    ctx_.wait(fold_in_);
    ctx_.reduce(out_, in_, tmp_, count_);
    src = out_;
    return true;
  }
  /// Hands the result back to the folded-out partner.
  void unfold() {
    if (ctx_.rank() >= 2 * folded_pairs_) return;
    ctx_.start(fold_back_);
    ctx_.wait(fold_back_);
  }

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* out_;
  uchar* tmp_ = nullptr;
  std::size_t count_ = 0, slots_ = 1;
  int butterfly_size_ = 1;  // p', the largest power of two <= p
  int folded_pairs_ = 0;    // p - p': ranks 0 .. 2 (p - p') - 1 fold in pairs
  int butterfly_rank_ = 0;  // rank among the p' butterfly ranks; -1 if folded out
  bool folded_out_ = false;
  std::size_t fold_in_ = 0, fold_back_ = 0;
};

template <class Transport>
class RhdAlgorithm : public ButterflyAlgorithm<Transport> {
  using Base = ButterflyAlgorithm<Transport>;
  using typename Base::Exchange;
  using typename Base::uchar;

 public:
  RhdAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out) : Base(ctx, in, out) {
    if (this->count_ == 0 || this->folded_out_) return;
    const int v = this->butterfly_rank_;
    // The halving steps read the input at first (or `out` after a fold), then `out`.
    const uchar* src = ctx.rank() < 2 * this->folded_pairs_ ? this->out_ : this->in_;
    std::size_t lo = 0, hi = this->count_;
    int e = 0;
    for (int m = this->butterfly_size_ / 2; m >= 1; m /= 2, ++e) {
      const std::size_t mid = lo + (hi - lo) / 2;
      const bool lower = (v & m) == 0;
      const std::size_t klo = lower ? lo : mid, khi = lower ? mid : hi;
      const std::size_t slo = lower ? mid : lo, shi = lower ? hi : mid;
      steps_.push_back(Step{
          lo, hi,
          this->add_exchange(e, this->real(v ^ m), src, slo, shi - slo, this->tmp_, klo, khi - klo),
          Exchange{}});
      src = this->out_;
      lo = klo;
      hi = khi;
    }
    // Recursive doubling all-gather, the halving steps in reverse.
    for (std::size_t k = steps_.size(); k-- > 0; ++e) {
      Step& s = steps_[k];
      const int m = this->butterfly_size_ / 2 >> k;
      // This rank holds [lo, hi); the partner holds the rest of [s.lo, s.hi).
      const std::size_t olo = lo == s.lo ? hi : s.lo, ohi = lo == s.lo ? s.hi : lo;
      s.gather = this->add_exchange(e, this->real(v ^ m), this->out_, lo, hi - lo, this->out_, olo,
                                    ohi - olo);
      lo = s.lo;
      hi = s.hi;
    }
  }

  void run() override {
    auto& ctx = this->ctx_;
    if (this->count_ == 0) return;
    const uchar* src = nullptr;
    if (!this->fold(src)) return;
    const std::size_t es = ctx.elem_bytes();
    uchar* out = this->out_;
    uchar* tmp = this->tmp_;
    std::size_t lo = 0, hi = this->count_;
    for (const Step& s : steps_) {
      this->run_exchange(s.scatter, [&](std::size_t off, std::size_t len) {
        ctx.reduce(out + off * es, src + off * es, tmp + off * es, len);
      });
      // Parts of `out` outside the kept range are not written yet, so later steps read `out`
      // only inside it.
      src = out;
      lo = s.scatter.roff;
      hi = lo + s.scatter.rlen;
    }
    if (src != out && hi > lo) std::memcpy(out + lo * es, src + lo * es, (hi - lo) * es);
    if (hi > lo) ctx.finish_avg(out + lo * es, hi - lo);
    for (std::size_t k = steps_.size(); k-- > 0;)
      this->run_exchange(steps_[k].gather, [](std::size_t, std::size_t) {});
    this->unfold();
  }

 private:
  struct Step {
    std::size_t lo, hi;  // the range both partners held before the halving step
    Exchange scatter, gather;
  };
  std::vector<Step> steps_;
};

}  // namespace dtrain::detail
