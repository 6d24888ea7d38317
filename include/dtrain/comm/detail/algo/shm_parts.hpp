// SPDX-License-Identifier: BSD-3-Clause
// dtrain: reduce_scatter and allgather on one node, read in place from the node-shared heaps.
//
// Where every rank's input and output lie in its heap (Communicator::shared_allocator), a call
// runs as one hand-off through the node-shared segments and moves no byte through the slots:
// each rank leaves its input's and output's places in its heap in the slot's last line and raises
// counter 0 for the call's chunk number (one number per call, shared with the shm all-reduce's
// numbering); once every rank's counter 0 is seen, rank r
// - reduce_scatter: reduces part r of the vector (partition_begin's split) from every rank's
//   input straight into its own output, starting from its own contribution, then the others in
//   the order r+1, r+2, ... (the shm all-reduce's order for the parts it owns, so with 2 ranks,
//   or with sum/min/max of exact values, the same bits as an all-reduce's part r); 2 ranks in one
//   pass that also finishes an average, more a piece that stays in L1 at a time;
// - allgather: copies every other rank's input into its place in its own output (the data are
//   read once, written once, and land in this rank's cache, where the caller reads them next);
// then raises counter 1 and returns once every rank raised its own (the others have read its
// input by then; the caller may overwrite it), and raises counter 2, which frees the slot.
//
// Elsewhere (a rank's buffers outside its heap, 16-bit floats widened into scratch memory, device
// memory) each rank still takes part in the hand-off, so that all decide alike from the same
// descriptors, and then every rank runs the ring algorithm (algo/ring.hpp) over the transport.
// Without node-shared segments (several nodes, DTRAIN_SHM=0) the plan holds the ring algorithm
// alone (collective_plan.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <dtrain/comm/detail/algo/context.hpp>
#include <dtrain/comm/detail/algo/ring.hpp>
#include <dtrain/comm/detail/algo/shm.hpp>
#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/detail/futex_wait.hpp>
#include <dtrain/comm/topology.hpp>

namespace dtrain::detail {

template <class Transport>
class ShmPartsAlgorithm : public Algorithm {
  using uchar = unsigned char;

 public:
  /// Whether a plan of `ctx` can hold this algorithm: the ranks share node segments whose
  /// slots hold a descriptor line.
  static bool usable(const PlanContext<Transport>& ctx) noexcept {
    const SharedSegments* w = ctx.shared_segments();
    return w != nullptr && w->slot_bytes >= kLine;
  }
  /// `in`, `out`: the spec's (reduce_scatter: the whole vector in, this rank's part out;
  /// allgather: this rank's part in, the whole vector out). Needs the context's shared segments.
  ShmPartsAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out)
      : ctx_(ctx),
        in_(static_cast<const uchar*>(in)),
        out_(static_cast<uchar*>(out)),
        seg_(ctx.shared_segments()),
        gather_(ctx.spec().kind == CollectiveKind::allgather) {
    DTRAIN_REQUIRE(
        usable(ctx), gather_ ? "allgather" : "reduce_scatter",
        "the in-place path needs node-shared segments of slots of at least " << kLine << " bytes");
    if (gather_)
      ring_ = std::make_unique<RingAllgather<Transport>>(ctx, in, out);
    else
      ring_ = std::make_unique<RingReduceScatter<Transport>>(ctx, in, out);
    const std::size_t n = ctx.spec().count, es = ctx.elem_bytes();
    const int p = ctx.size(), r = ctx.rank();
    const std::size_t part = block_begin(n, p, r + 1) - block_begin(n, p, r);
    const std::size_t in_bytes = (gather_ ? part : n) * es, out_bytes = (gather_ ? n : part) * es;
    // Fixed for the plan's life: the buffers are.
    offer_ =
        !ctx.widened() && seg_->in_own_heap(in_, in_bytes) && seg_->in_own_heap(out_, out_bytes);
    peer_in_.assign(static_cast<std::size_t>(p), nullptr);
    Transport& t = ctx.transport();
    spin_ = segment_spin_seconds(node_map_of(t).machine_ranks(t.rank()),
                                 std::thread::hardware_concurrency(), seg_->slot_bytes);
  }

  void run() override {
    SharedSegments& w = *seg_;
    const int p = ctx_.size(), r = ctx_.rank();
    const std::uint64_t g = w.next_chunk;
    const int slot = free_slot_for(ctx_, w, g, spin_);
    Descriptor d;
    if (offer_) {
      d.offer = 1;
      d.in = w.own_heap_offset(in_);
      d.out = w.own_heap_offset(out_);
    }
    std::memcpy(w.slot(r, slot) + w.slot_bytes - kLine, &d, sizeof(d));
    counter_publish(w.flag(r, 0, slot), g + 1);
    // Every rank reads the same descriptors, so all decide alike; one that does not offer
    // decides at once.
    bool all = offer_;
    for (int i = 1; i < p && all; ++i) {
      const int q = (r + i) % p;
      wait_counter(w, q, 0, slot, g + 1);
      Descriptor e;
      std::memcpy(&e, w.slot(q, slot) + w.slot_bytes - kLine, sizeof(e));
      all = e.offer != 0;
      if (all) peer_in_[static_cast<std::size_t>(q)] = w.heap_at(q, e.in);
    }
    if (all) {
      if (gather_)
        gather_in_place();
      else
        reduce_in_place();
      ++w.part_calls;
      counter_publish(w.flag(r, 1, slot), g + 1);
      for (int i = 1; i < p; ++i) wait_counter(w, (r + i) % p, 1, slot, g + 1);
    } else {
      counter_publish(w.flag(r, 1, slot), g + 1);
    }
    // Counter 2: this rank has read every descriptor it will read of this chunk.
    counter_publish(w.flag(r, 2, slot), g + 1);
    w.next_chunk += 1;
    if (!all) ring_->run();
  }

 private:
  // What a rank leaves in its slot's last line: whether its buffers lie in its heap, and where.
  struct Descriptor {
    std::size_t offer = 0;
    std::size_t in = 0, out = 0;
  };
  static_assert(sizeof(Descriptor) <= 64, "a descriptor fits the slot's last line");

  // Part r of every rank's input, reduced into this rank's output.
  void reduce_in_place() {
    const std::size_t n = ctx_.spec().count, es = ctx_.elem_bytes();
    const int p = ctx_.size(), r = ctx_.rank();
    const std::size_t b0 = block_begin(n, p, r), len = block_begin(n, p, r + 1) - b0;
    if (!len) return;
    auto input = [&](int j, std::size_t at) {  // the j-th contribution, at element `at` of part r
      const int q = (r + j) % p;
      return (q == r ? in_ : peer_in_[static_cast<std::size_t>(q)]) + (b0 + at) * es;
    };
    if (p == 2) {  // one pass, the average finished as it is stored
      ctx_.reduce_finish_twice(out_, out_, input(0, 0), input(1, 0), len);
      return;
    }
    const std::size_t step = std::max<std::size_t>(1, kPieceBytes / es);
    for (std::size_t e0 = 0; e0 < len; e0 += step) {
      const std::size_t m = std::min(step, len - e0);
      uchar* dst = out_ + e0 * es;
      for (int j = 1; j < p; ++j) ctx_.reduce(dst, j == 1 ? input(0, e0) : dst, input(j, e0), m);
      ctx_.finish_avg(dst, m);
    }
  }

  // Every other rank's input, into its part of this rank's output; this rank's own too, unless
  // it is already there (in place).
  void gather_in_place() {
    const std::size_t n = ctx_.spec().count, es = ctx_.elem_bytes();
    const int p = ctx_.size(), r = ctx_.rank();
    for (int q = 0; q < p; ++q) {
      const std::size_t b0 = block_begin(n, p, q), len = block_begin(n, p, q + 1) - b0;
      const uchar* src = q == r ? in_ : peer_in_[static_cast<std::size_t>(q)];
      if (len && src != out_ + b0 * es) std::memcpy(out_ + b0 * es, src, len * es);
    }
  }

  void wait_counter(const SharedSegments& w, int q, int kind, int s, std::uint64_t target) {
    wait_segment_counter(ctx_, w, q, kind, s, target, spin_);
  }
  static constexpr std::size_t kLine = 64, kPieceBytes = 16 * 1024;

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* out_;
  SharedSegments* seg_;
  bool gather_;
  bool offer_ = false;
  double spin_ = Backoff::kSpinSeconds;
  std::unique_ptr<Algorithm> ring_;    // where some rank's buffers lie outside its heap
  std::vector<const uchar*> peer_in_;  // per rank: its input, as mapped here
};

}  // namespace dtrain::detail
