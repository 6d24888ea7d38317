// SPDX-License-Identifier: BSD-3-Clause
// dtrain: recursive doubling all-reduce: the whole vector exchanged and reduced in lg p' steps
// (fewest steps, for latency-bound sizes), with the fold of rhd.hpp for the ranks beyond the
// largest power of two.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include <dtrain/comm/detail/algo/rhd.hpp>

namespace dtrain::detail {

template <class Transport>
class RdAlgorithm : public ButterflyAlgorithm<Transport> {
  using Base = ButterflyAlgorithm<Transport>;
  using typename Base::Exchange;

 public:
  RdAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out) : Base(ctx, in, out) {
    if (this->count_ == 0 || this->folded_out_) return;
    int e = 0;
    for (int m = 1; m < this->butterfly_size_; m <<= 1, ++e)
      steps_.push_back(this->add_exchange(e, this->real(this->butterfly_rank_ ^ m), this->out_, 0,
                                          this->count_, this->tmp_, 0, this->count_));
  }

  void run() override {
    auto& ctx = this->ctx_;
    const std::size_t n = this->count_;
    if (n == 0) return;
    const unsigned char* src = nullptr;
    if (!this->fold(src)) return;
    if (src != this->out_) std::memcpy(this->out_, src, n * ctx.elem_bytes());
    for (const Exchange& x : steps_) {
      this->run_exchange(x, [](std::size_t, std::size_t) {});
      ctx.reduce(this->out_, this->out_, this->tmp_, n);
    }
    ctx.finish_avg(this->out_, n);
    this->unfold();
  }

 private:
  std::vector<Exchange> steps_;
};

}  // namespace dtrain::detail
