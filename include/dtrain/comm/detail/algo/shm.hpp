// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the shm all-reduce, a reduce-scatter + all-gather through node-shared segments.
// The vector goes through in chunks of one slot. For chunk g (numbered across collectives, so
// the counters only grow) in slot s = g % slots, every rank copies into its own slot the parts
// of its input chunk that the other ranks reduce (partition q of p belongs to rank q) and
// raises counter 0; reduces its own part straight from its private input and the other
// ranks' slots into its output, publishes that result in its slot and raises counter 1; copies
// the other ranks' results out and raises counter 2. A rank's own part is thus never copied
// in, and each byte is read from private memory once and written there once. A slot is
// refilled only after every rank raised counter 2 for its previous chunk, so up to `slots`
// chunks are in flight and the copies of one chunk overlap the reduction of another.
//
// ordered_shm (the reproducible mode's algorithm on node-shared segments) is the same protocol
// with the owner adding the p contributions to its part in rank order, x_0 + x_1 + ... + x_{p-1},
// so its bits are those of `ordered` (algo/ordered.hpp) whatever the chunking; it shares shm's
// counters (the two may alternate on one communicator), chunk placement, waits and in-place
// reads of heap buffers.
//
// In place: where a rank's input and output chunk both lie in its part of the node-shared heap
// (SharedSegmentConfig::heap_bytes; Communicator::shared_allocator), it copies nothing into its
// slot. Its slot's last line then says so, with the chunk's offsets in its heap, and the others
// reduce from its input and copy its reduced part from its output where they are: two of the
// four passes over each byte are gone. An all-reduce in place (input = output, as gradient sync
// runs) lends only its reduced part and still copies its input into the slot: the others would
// otherwise read parts of the buffer that this rank then overwrites with their results, each
// write first taking the line back from their caches, and that cost what the saved copy gained
// (2 ranks: level with the slot path at 256 KiB-16 MiB; lending the output alone 0-14% faster,
// benchmarks/RESULTS.md). Each rank decides per chunk from its own buffers, so a
// mix of ranks is correct; the readers' counter raises order everything as before (a rank
// rewrites part q of its buffer only after rank q raised counter 1, i.e. finished reading
// it), and a rank that lent its buffers returns only once every rank raised counter 2 for the
// last chunk, since the caller may write them then.
//
// Whole calls from the heaps: where every rank's input and output lie whole in its heap (gradient
// arenas on Communicator::shared_allocator), no byte goes through the slots. Each rank says so in
// its first chunk's descriptor; once every rank raised counter 0 for that chunk (all inputs are
// final), rank r reduces its part of every chunk straight from all ranks' inputs and stores the
// result into every rank's output (2 ranks: one pass that reads each element of both inputs and
// stores it to both outputs; more: in pieces of kPieceBytes through a buffer that stays in L1),
// raises counter 1 and returns once every rank raised counter 1: two hand-offs per call, one chunk
// number consumed. A rank reads and writes only part r of the others' buffers, and nobody else
// touches those parts during the call, so in place is safe. The parts are the slot path's (part r
// of each chunk, the owner's contribution first), so the bits are the same wherever the buffers
// lie. Against the slot path, 2 ranks, in place, buffers in the heaps: 2-3x faster from 16 KiB
// to 16 MiB (medians; benchmarks/RESULTS.md). If any rank's buffers are elsewhere, every rank
// carries on with the slot path, the offering ranks lending that first chunk's input as well as its
// output.
//
// Small calls (at most kOneShotBytes, 4 KiB) take one hand-off instead of two: every rank
// copies its whole input into its slot (or, where its buffers lie in its heap, offers them in
// place), and once every rank's input is there, each computes the whole result into its own
// output, part by part in the slot path's order, so the bits do not change (small_call). Where
// every rank offers its heap buffers, the whole-call path above runs instead (faster there).
//
// Waits for a partner's counter spin for about the time the partner needs for one chunk before
// they sleep in the kernel until the partner's raise wakes them (detail/futex_wait.hpp), as long
// as the ranks do not outnumber the cores: every rank then has a core and the partner answers
// within that time. On a progress thread, whose rank computes meanwhile, the spin is cut to
// kProgressSpinSeconds (detail/backoff.hpp). Before the kernel waits, these waits yielded, and a
// yield hands the core to another process for a time slice once per chunk (the cause of shm's
// bandwidth collapsing on a loaded machine, benchmarks/RESULTS.md).
//
// Where a slot is large (kAlignMinSlot and up), a chunk's data sits in its slot at the same
// offset modulo a page as the chunk's place in this rank's output, and the writer leaves that
// offset in the slot's last line for the readers. With the user's buffers at malloc's usual 16
// bytes past a page and the slots on a page boundary, shm ran 1.3-1.5x slower at 1-4 MiB than
// with page-aligned buffers, while the MPI algorithms did not notice (2 ranks,
// benchmarks/RESULTS.md): copies and a reduction whose source and destination sit at different
// offsets within a page (misaligned against each other, and with a destination a few bytes above
// its source, loads that wait on stores that only alias them modulo 4 KiB; which of the two
// dominates was not separated). A chunk is a page and a line shorter than the slot for it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <dtrain/comm/detail/algo/context.hpp>
#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/detail/futex_wait.hpp>
#include <dtrain/comm/topology.hpp>

namespace dtrain::detail {

/// Local. Bytes of the user's vector one shm chunk carries through a slot of `slot_bytes`: a
/// page and a line less than the slot where chunks are placed by offset (see the top), the whole
/// slot otherwise. The cost model's shm_chunk (calibration.hpp) is this, so its count of counter
/// hand-offs per message is the algorithm's.
constexpr std::size_t shm_chunk_bytes(std::size_t slot_bytes) noexcept {
  constexpr std::size_t page = 4096, line = 64, align_min_slot = 64 * 1024;
  return slot_bytes >= align_min_slot && slot_bytes % line == 0 ? slot_bytes - page - line
                                                                : slot_bytes;
}

/// Waits until rank q's counter `kind` of `slot` in `w` reaches `target`: spins for `spin`
/// seconds, then sleeps (detail/futex_wait.hpp), driving the transport's progress meanwhile;
/// past `ctx`'s deadline, its error naming the rank, the call and the peer. Local, blocking.
template <class Transport>
void wait_segment_counter(const PlanContext<Transport>& ctx, const SharedSegments& w, int q,
                          int kind, int slot, std::uint64_t target, double spin) {
  if (!counter_wait(w.flag(q, kind, slot), target, ctx.deadline(), spin, kFutexSliceSeconds,
                    ctx.wait_progress()))
    ctx.timeout(ctx.transport_rank(q));
}

/// The slot of chunk number g, once every rank has read out the chunk it held before (counter 2
/// of chunk g - slots), so that this rank may fill it. Local, blocking.
template <class Transport>
int free_slot_for(const PlanContext<Transport>& ctx, const SharedSegments& w, std::uint64_t g,
                  double spin) {
  const auto S = static_cast<std::uint64_t>(w.slots);
  const int slot = static_cast<int>(g % S);
  if (g >= S)
    for (int q = 0; q < ctx.size(); ++q) wait_segment_counter(ctx, w, q, 2, slot, g - S + 1, spin);
  return slot;
}

template <class Transport>
class ShmAlgorithm : public Algorithm {
  using uchar = unsigned char;

 public:
  /// `rank_order`: sum each element in rank order (ordered_shm, the reproducible mode's
  /// bits), else starting from the owner's own contribution (shm).
  ShmAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out, bool rank_order = false)
      : ctx_(ctx),
        in_(static_cast<const uchar*>(in)),
        out_(static_cast<uchar*>(out)),
        seg_(ctx.shared_segments()),
        rank_order_(rank_order) {
    DTRAIN_REQUIRE(seg_ != nullptr, "allreduce",
                   "algorithm " << (rank_order ? "ordered_shm" : "shm")
                                << " needs a transport with node-shared segments (all ranks on "
                                   "one node, DTRAIN_SHM not 0)"
                                << (rank_order ? "; ordered works on any transport" : ""));
    chunk_bytes_ = shm_chunk_bytes(seg_->slot_bytes);
    aligned_ = chunk_bytes_ != seg_->slot_bytes;
    sources_.assign(static_cast<std::size_t>(ctx.size()), Source{});
    outputs_.assign(static_cast<std::size_t>(ctx.size()), nullptr);
    piece_.assign(kPieceBytes, 0);
    Transport& t = ctx.transport();
    spin_ = segment_spin_seconds(node_map_of(t).machine_ranks(t.rank()),
                                 std::thread::hardware_concurrency(), seg_->slot_bytes);
  }

  void run() override {
    SharedSegments& w = *seg_;
    const std::size_t n = ctx_.spec().count, es = ctx_.elem_bytes();
    const int p = ctx_.size(), r = ctx_.rank(), S = w.slots;
    const std::size_t chunk = chunk_bytes_ / es;
    const std::size_t nchunks = ceil_div(n, chunk);
    if (p > 1 && n && n * es <= std::min(kOneShotBytes, chunk_bytes_)) {
      small_call(w, n, es);
      return;
    }
    const uchar* in = in_;
    uchar* out = out_;
    bool any_direct = false;
    for (std::size_t k = 0; k < nchunks; ++k) {
      const std::uint64_t g = w.next_chunk + k;
      const int slot = free_slot_for(ctx_, w, g, spin_);
      const std::size_t c0 = k * chunk, cl = std::min(chunk, n - c0);
      const std::size_t b0 = block_begin(cl, p, r), b1 = block_begin(cl, p, r + 1);
      // Where the other ranks find this chunk's data: in place, where input and output both lie
      // in this rank's heap, else in the slot at the output's offset within a page (see the top).
      Descriptor d;
      const bool lend =
          aligned_ && w.in_own_heap(in + c0 * es, cl * es) && w.in_own_heap(out + c0 * es, cl * es);
      // The first chunk offers the whole call to the others (kWhole) where this rank's whole
      // input and output lie in its heap; it then lends its input in place too, since either
      // every rank offers and nothing goes through the slots, or the slot path reads it there.
      const bool whole =
          k == 0 && p > 1 && lend && w.in_own_heap(in, n * es) && w.in_own_heap(out, n * es);
      // In place, the input stays in the slot path: the others would read the parts of this
      // buffer that this rank then overwrites with their results (see the top).
      d.direct = whole  ? kLendIn | kLendOut | kWhole
                 : lend ? (in == out ? kLendOut : kLendIn | kLendOut)
                        : 0;
      if (lend) {
        d.in = w.own_heap_offset(in + c0 * es);
        d.out = w.own_heap_offset(out + c0 * es);
        any_direct = true;
        ++w.direct_chunks;
      }
      if (aligned_ && !(d.direct & kLendIn))
        d.off = reinterpret_cast<std::uintptr_t>(out + c0 * es) % kPage;
      if (aligned_) std::memcpy(w.slot(r, slot) + w.slot_bytes - kLine, &d, sizeof(d));
      uchar* my_slot = w.slot(r, slot) + d.off;
      // Everything but this rank's own part, which it reduces from `in` directly.
      if (!(d.direct & kLendIn)) {
        if (b0) std::memcpy(my_slot, in + c0 * es, b0 * es);
        if (cl > b1) std::memcpy(my_slot + b1 * es, in + (c0 + b1) * es, (cl - b1) * es);
      }
      counter_publish(w.flag(r, 0, slot), g + 1);
      if (every_rank_offers_whole(w, slot, g, d)) {
        push_whole(w, slot, g);
        return;
      }
      const std::size_t bl = b1 - b0;
      uchar* dst = out + (c0 + b0) * es;
      const uchar* first = in + (c0 + b0) * es;
      if (rank_order_) {
        // x_0 + x_1 + ... + x_{p-1}. The result itself accumulates when this rank comes first
        // (it may be this rank's input, in place), else this rank's part of its own slot does
        // until the last addition: nobody reads it before counter 1, and an in-place input is
        // then still intact when its turn comes.
        uchar* acc = r == 0 ? dst : my_slot + b0 * es;
        const uchar* prev = nullptr;
        for (int q = 0; q < p; ++q) {
          const uchar* x = first;
          if (q != r) {
            wait_counter(w, q, 0, slot, g + 1);
            x = peer_source(w, q, slot).in + b0 * es;  // also when this rank's part is empty
          }
          if (q == 0 || !bl) {
            prev = x;
            continue;
          }
          uchar* to = q == p - 1 ? dst : acc;
          ctx_.reduce(to, prev, x, bl);
          prev = to;
        }
      } else {
        for (int i = 1; i < p; ++i) {
          const int q = (r + i) % p;
          wait_counter(w, q, 0, slot, g + 1);
          const Source src = peer_source(w, q, slot);  // also when this rank's part is empty
          if (bl) ctx_.reduce(dst, i == 1 ? first : dst, src.in + b0 * es, bl);
        }
      }
      if (bl) ctx_.finish_avg(dst, bl);
      if (bl && !(d.direct & kLendOut)) std::memcpy(my_slot + b0 * es, dst, bl * es);
      counter_publish(w.flag(r, 1, slot), g + 1);
      for (int i = 1; i < p; ++i) {
        const int q = (r + i) % p;
        wait_counter(w, q, 1, slot, g + 1);
        const std::size_t q0 = block_begin(cl, p, q), ql = block_begin(cl, p, q + 1) - q0;
        if (ql)
          std::memcpy(out + (c0 + q0) * es, sources_[static_cast<std::size_t>(q)].out + q0 * es,
                      ql * es);
      }
      counter_publish(w.flag(r, 2, slot), g + 1);
    }
    w.next_chunk += nchunks;
    // The other ranks read this rank's input and output in place until they raise counter 2 (for
    // chunks in order, so the last chunk's covers all); the caller may write both on return.
    if (any_direct && nchunks) {
      const std::uint64_t last = w.next_chunk - 1;
      const int slot = static_cast<int>(last % static_cast<std::uint64_t>(S));
      for (int i = 1; i < p; ++i) wait_counter(w, (r + i) % p, 2, slot, last + 1);
    }
  }

 private:
  // What a rank leaves in its slot's last line for a chunk: what the others read in place (its
  // input, its reduced part, both: kLend* bits) and where (offsets in its heap of the chunk's
  // input and output), and the offset in the slot of what they read there.
  static constexpr std::size_t kLendIn = 1, kLendOut = 2, kWhole = 4;
  struct Descriptor {
    std::size_t off = 0;
    std::size_t direct = 0;
    std::size_t in = 0, out = 0;
  };
  static_assert(sizeof(Descriptor) <= 64, "a descriptor fits the slot's last line");
  // Where rank q's chunk input (for this rank's reduction) and, once q raised counter 1, its
  // reduced part lie, as mapped here.
  struct Source {
    const uchar* in = nullptr;
    const uchar* out = nullptr;
  };
  // Rank q's chunk in `slot`, once its counter 0 for the chunk there was seen, from the
  // descriptor it left (remembered for the copy-out of the same chunk).
  const Source& peer_source(const SharedSegments& w, int q, int slot) {
    const Descriptor d = aligned_ ? descriptor_of(w, q, slot) : Descriptor{};
    Source& s = sources_[static_cast<std::size_t>(q)];
    const uchar* in_slot = w.slot(q, slot) + d.off;
    s.in = d.direct & kLendIn ? w.heap_at(q, d.in) : in_slot;
    s.out = d.direct & kLendOut ? w.heap_at(q, d.out) : in_slot;
    return s;
  }
  // What rank q left in its slot's last line.
  static Descriptor descriptor_of(const SharedSegments& w, int q, int slot) {
    Descriptor d;
    std::memcpy(&d, w.slot(q, slot) + w.slot_bytes - kLine, sizeof(d));
    return d;
  }
  // At the first chunk, after this rank raised its counter 0 for it: whether every rank offered
  // the whole call in place (kWhole; waits for every counter 0 of the chunk first, and remembers
  // where each rank's buffers are). Every rank reads the same descriptors, so all decide alike.
  // This rank not offering (every chunk but the first) decides it at once, for every rank alike.
  bool every_rank_offers_whole(SharedSegments& w, int slot, std::uint64_t g, const Descriptor& d) {
    if (!(d.direct & kWhole)) return false;
    const int p = ctx_.size(), r = ctx_.rank();
    for (int i = 1; i < p; ++i) {
      const int q = (r + i) % p;
      wait_counter(w, q, 0, slot, g + 1);
      const Descriptor e = descriptor_of(w, q, slot);
      if (!(e.direct & kWhole)) return false;
      sources_[static_cast<std::size_t>(q)].in = w.heap_at(q, e.in);
      outputs_[static_cast<std::size_t>(q)] = w.heap_to_write(q, e.out);
    }
    return true;
  }

  // The whole call, every rank's buffers in its heap: this rank reduces its part of the vector
  // straight from every rank's input (2 ranks: in one pass that also stores the result; more: a
  // piece at a time into `piece_`) and stores it into every rank's output; then raises counter 1
  // and returns once every rank raised its own (nobody reads or writes this rank's buffers after
  // that). No slot copies, two hand-offs per call. The sum's order is the slot path's (from this
  // rank's own contribution, or in rank order for ordered_shm), so the bits are the same. A rank
  // reads only the others' part r and writes only part r of every output, so in place is safe:
  // part r of rank q's buffer is read and then overwritten by this rank alone.
  void push_whole(SharedSegments& w, int slot, std::uint64_t g) {
    const std::size_t n = ctx_.spec().count, es = ctx_.elem_bytes();
    const int p = ctx_.size(), r = ctx_.rank();
    sources_[static_cast<std::size_t>(r)].in = in_;
    outputs_[static_cast<std::size_t>(r)] = out_;
    const std::size_t chunk = chunk_bytes_ / es, step = piece_.size() / es;
    uchar* acc = piece_.data();
    // Partition r of every chunk, as the slot path owns it (the owner's contribution comes
    // first in the sum: the same owner gives the same bits).
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t cl = std::min(chunk, n - c0);
      const std::size_t b1 = c0 + block_begin(cl, p, r + 1);
      const std::size_t b0 = c0 + block_begin(cl, p, r);
      if (p == 2) {  // one pass: each line of the other's buffer is read and stored at once
        const std::size_t at = b0 * es;
        const int first = rank_order_ ? 0 : r;
        ctx_.reduce_finish_twice(outputs_[0] + at, outputs_[1] + at,
                                 sources_[static_cast<std::size_t>(first)].in + at,
                                 sources_[static_cast<std::size_t>(1 - first)].in + at, b1 - b0);
        continue;
      }
      for (std::size_t e0 = b0; e0 < b1; e0 += step) {
        const std::size_t len = std::min(step, b1 - e0), at = e0 * es;
        auto input = [&](int j) {  // the j-th contribution in the order of the sum
          const int q = rank_order_ ? j : (r + j) % p;
          return sources_[static_cast<std::size_t>(q)].in + at;
        };
        for (int j = 1; j < p; ++j) ctx_.reduce(acc, j == 1 ? input(0) : acc, input(j), len);
        ctx_.finish_avg(acc, len);
        for (uchar* o : outputs_) std::memcpy(o + at, acc, len * es);
      }
    }
    ++w.whole_calls;
    counter_publish(w.flag(r, 1, slot), g + 1);
    for (int i = 1; i < p; ++i) wait_counter(w, (r + i) % p, 1, slot, g + 1);
    counter_publish(w.flag(r, 2, slot), g + 1);
    w.next_chunk += 1;
  }

  // A call of at most kOneShotBytes (one chunk). A rank whose buffers lie in its heap offers the
  // whole call, as the first chunk of a larger call does; any other copies its input into its
  // slot. Each raises counter 0. If every rank offered: push_whole. Else, once every other rank's
  // counter 0 is seen, every rank computes the whole result from the inputs (the slots, or in
  // place in the heaps of the ranks that offered) into its output, each part q in the slot path's
  // order for part q (from rank q's contribution, or in rank order for ordered_shm: the same
  // bits), and raises counter 2, which lets the others refill their slots: one hand-off per call
  // against the slot path's two (counter 0, then counter 1 before the copy-out). Every rank sums
  // the whole vector rather than its part, which below kOneShotBytes costs less than the second
  // hand-off (2 ranks, private buffers: 0.35 us of 2.65 faster at 1 KiB, 0.65 of 3.5 at 4 KiB;
  // level at 8 KiB, slower beyond; benchmarks/RESULTS.md). A rank that offered has its input read
  // in place, so it sums into piece_ and writes its output only once every rank raised counter 2.
  // An offering rank does not copy its input: with every rank in its heap (the usual case) the copy
  // would fetch the part that the other rank's push_whole wrote there, and cost more than the
  // hand-off saved.
  void small_call(SharedSegments& w, std::size_t n, std::size_t es) {
    const int p = ctx_.size(), r = ctx_.rank();
    const std::uint64_t g = w.next_chunk;
    const int slot = free_slot_for(ctx_, w, g, spin_);
    Descriptor d;
    const bool offer = aligned_ && w.in_own_heap(in_, n * es) && w.in_own_heap(out_, n * es);
    if (offer) {
      d.direct = kLendIn | kLendOut | kWhole;
      d.in = w.own_heap_offset(in_);
      d.out = w.own_heap_offset(out_);
      ++w.direct_chunks;
    } else {
      std::memcpy(w.slot(r, slot), in_, n * es);
    }
    if (aligned_) std::memcpy(w.slot(r, slot) + w.slot_bytes - kLine, &d, sizeof(d));
    counter_publish(w.flag(r, 0, slot), g + 1);
    if (every_rank_offers_whole(w, slot, g, d)) {
      push_whole(w, slot, g);
      return;
    }
    for (int i = 1; i < p; ++i) {
      const int q = (r + i) % p;
      wait_counter(w, q, 0, slot, g + 1);
      const Descriptor e = aligned_ ? descriptor_of(w, q, slot) : Descriptor{};
      sources_[static_cast<std::size_t>(q)].in =
          e.direct & kLendIn ? w.heap_at(q, e.in) : w.slot(q, slot);
    }
    // This rank's own contribution from where the others read it: its input may be its output.
    sources_[static_cast<std::size_t>(r)].in = offer ? in_ : w.slot(r, slot);
    uchar* const result = offer ? piece_.data() : out_;
    for (int q = 0; q < p; ++q) {
      const std::size_t b0 = block_begin(n, p, q), bl = block_begin(n, p, q + 1) - b0;
      if (!bl) continue;
      uchar* dst = result + b0 * es;
      auto input = [&](int j) {  // the j-th contribution to part q in the order of the sum
        return sources_[static_cast<std::size_t>(rank_order_ ? j : (q + j) % p)].in + b0 * es;
      };
      for (int j = 1; j < p; ++j) ctx_.reduce(dst, j == 1 ? input(0) : dst, input(j), bl);
    }
    ctx_.finish_avg(result, n);
    ++w.one_shot_calls;
    counter_publish(w.flag(r, 2, slot), g + 1);
    w.next_chunk += 1;
    if (offer) {
      for (int i = 1; i < p; ++i) wait_counter(w, (r + i) % p, 2, slot, g + 1);
      std::memcpy(out_, result, n * es);
    }
  }

  void wait_counter(const SharedSegments& w, int q, int kind, int s, std::uint64_t target) {
    wait_segment_counter(ctx_, w, q, kind, s, target, spin_);
  }
  static constexpr std::size_t kPage = 4096, kLine = 64, kPieceBytes = 16 * 1024;
  static constexpr std::size_t kOneShotBytes = 4 * 1024;
  static_assert(kOneShotBytes <= kPieceBytes, "small_call sums into piece_");
  // Smallest slot whose chunks are placed by offset (the page it gives up is at most 6%).
  static constexpr std::size_t kAlignMinSlot = 64 * 1024;
  static_assert(shm_chunk_bytes(kAlignMinSlot) == kAlignMinSlot - kPage - kLine &&
                    shm_chunk_bytes(kAlignMinSlot - kLine) == kAlignMinSlot - kLine,
                "shm_chunk_bytes and the slot layout agree");

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* out_;
  SharedSegments* seg_;
  bool rank_order_ = false;
  double spin_ = Backoff::kSpinSeconds;
  bool aligned_ = false;
  std::size_t chunk_bytes_ = 0;
  std::vector<Source> sources_;  // per rank: where its current chunk's data lie
  std::vector<uchar*> outputs_;  // push_whole: every rank's output, as mapped here
  std::vector<uchar> piece_;     // push_whole's reduced piece (a fraction of the L1 cache)
};

}  // namespace dtrain::detail
