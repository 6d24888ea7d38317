// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the two-level all-reduces over the transport's node grouping (<dtrain/comm/
// topology.hpp>).
//
// hier: the vector is cut into Lmax parts (Lmax = ranks on the largest node); on a node of L
// ranks, rank l owns the consecutive parts block(Lmax, L, l), so every node covers every part
// and uneven nodes still line up. (1) intra-node reduce-scatter: each rank reduces its parts
// over its node, through the node's shared segments (chunked like shm.hpp, same counters) or,
// without segments, by direct messages; (2) inter-node all-reduce of each part among its owners
// (one per node, group rank = node number) with a flat algorithm run on a group view of the
// plan (PlanContext's group constructor), so it works over any transport; (3) intra-node
// all-gather. A rank of a small node owns several parts and runs their groups in ascending part
// order, as every rank does, so the groups cannot wait on each other in a cycle.
//
// hier_leader (small messages): intra-node reduce to the node's lowest rank, an all-reduce
// among those leaders, intra-node broadcast.
//
// The inter-node algorithm (ring, rhd, rd or tree) is chosen per plan from the communicator's
// cost model at the between-node alpha and beta (CostModel::best_inter), the same on every rank
// since the model is; without a measured or given model it is ring for hier and rd for
// hier_leader (hier_inter_algorithm() overrides it for tests).
//
// Channel ids: the intra-node messages use the first two algorithm ids (they connect ranks of one
// node, the groups connect ranks of different nodes); group j gets its own id range, sized by a
// bound on what its algorithm uses, so a pair of ranks meeting in several groups never shares an
// id. avg is a sum until the owner of an element divides it by the number of ranks, once.
//
// In place, as in shm.hpp: where a rank's chunk of the buffer the others read (its input in the
// reduce-scatter and hier_leader's reduce, when out of place; its output in the all-gather and
// the broadcast) lies in its part of the node-shared heap (SharedSegmentConfig::heap_bytes;
// Communicator::shared_allocator), it copies nothing into its slot; the slot's last line says so
// with the chunk's offset in its heap, and the others read it there. A chunk is then a page and
// a line shorter than a slot of 64 KiB and up (shm_chunk_bytes), the slot's last line holding
// that descriptor. Each rank decides per chunk. The orders that make it safe: a rank rewrites
// another rank's range of its output (all-gather) only after that rank raised counter 0 of an
// all-gather chunk, i.e. finished its reduce-scatter reads; and a rank that lent a buffer
// returns only once every rank it lent to has raised counter 2 for the last chunk.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <dtrain/comm/detail/algo/context.hpp>
#include <dtrain/comm/detail/algo/rd.hpp>
#include <dtrain/comm/detail/algo/rhd.hpp>
#include <dtrain/comm/detail/algo/ring.hpp>
#include <dtrain/comm/detail/algo/shm.hpp>
#include <dtrain/comm/detail/algo/tree.hpp>
#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/detail/futex_wait.hpp>
#include <dtrain/comm/topology.hpp>

namespace dtrain::detail {

/// Test knob: the inter-node algorithm of every hier / hier_leader plan made while it is not
/// automatic (set it before the ranks make their plans, the same on every rank).
inline AllreduceAlgorithm& hier_inter_algorithm() {
  static AllreduceAlgorithm a = AllreduceAlgorithm::automatic;
  return a;
}

/// What both two-level algorithms share: the node grouping, the node's shared segments and the
/// counter protocol on them, and the construction of inter-node group views.
template <class Transport>
class HierBase : public Algorithm {
 protected:
  using uchar = unsigned char;

  HierBase(PlanContext<Transport>& ctx, const void* in, void* out, const char* name)
      : ctx_(ctx),
        in_(static_cast<const uchar*>(in)),
        out_(static_cast<uchar*>(out)),
        nodes_(node_map_of(ctx.transport())),
        count_(ctx.spec().count),
        elem_bytes_(ctx.elem_bytes()) {
    DTRAIN_REQUIRE(
        nodes_.size() == ctx.size(), "allreduce",
        name << ": the transport's node map has " << nodes_.size() << " ranks, not " << ctx.size());
    const int me = ctx.rank();
    node_ = nodes_.node_of(me);
    node_size_ = nodes_.node_size(node_);
    local_rank_ = nodes_.local_rank(me);
    if (node_size_ > 1) seg_ = node_segments_of(ctx.transport());
    // As in shm.hpp, counting every rank on this machine (other fake nodes share its cores).
    if (seg_)
      spin_ = segment_spin_seconds(nodes_.machine_ranks(me), std::thread::hardware_concurrency(),
                                   seg_->slot_bytes);
    if (seg_)
      DTRAIN_REQUIRE(seg_->size == node_size_ && seg_->rank == local_rank_, "allreduce",
                     name << ": node segments of " << seg_->size << " ranks (this is rank "
                          << seg_->rank << ") but the node map has " << node_size_ << " (rank "
                          << local_rank_ << ")");
    if (seg_) {
      chunk_bytes_ = shm_chunk_bytes(seg_->slot_bytes);
      lendable_ = chunk_bytes_ != seg_->slot_bytes;
    }
    // The views reduce with sum where the plan averages: the owner divides once at the end.
    group_op_ = ctx.spec().op == ReduceOp::avg ? ReduceOp::sum : ctx.spec().op;
  }

  /// Transport rank of local rank `q` of this node.
  int member(int q) const { return nodes_.members(node_)[static_cast<std::size_t>(q)]; }

  /// The flat algorithm for an all-reduce of `count` elements among `N` nodes' ranks: the test
  /// knob, else the cost model's cheapest at the between-node terms, else `fallback`.
  AllreduceAlgorithm inter_choice(std::size_t count, int N, AllreduceAlgorithm fallback) {
    if (hier_inter_algorithm() != AllreduceAlgorithm::automatic) return hier_inter_algorithm();
    const CostModel& cm = ctx_.comm().cost;
    if (!cm.valid() || N <= 1) return fallback;
    return cm.at_size(count_ * elem_bytes_).between_nodes().best_inter(count * elem_bytes_, N);
  }
  /// That algorithm on `view`, in place on `data`.
  static std::unique_ptr<Algorithm> make_inter(AllreduceAlgorithm a, PlanContext<Transport>& view,
                                               uchar* data) {
    switch (a) {
      case AllreduceAlgorithm::rhd:
        return std::make_unique<RhdAlgorithm<Transport>>(view, data, data);
      case AllreduceAlgorithm::rd:
        return std::make_unique<RdAlgorithm<Transport>>(view, data, data);
      case AllreduceAlgorithm::tree:
        return std::make_unique<TreeAlgorithm<Transport>>(view, data, data);
      default: return std::make_unique<RingAlgorithm<Transport>>(view, data, data, true, true);
    }
  }

  /// An upper bound on the channel ids (beyond kFirstAlgorithmChannel) any flat algorithm uses
  /// for `count` elements over `p` ranks: ring 2(p-1)·segments, rhd / rd 2 + 2·lg p·(segments+1),
  /// tree 4·segments.
  long long id_span(int p, std::size_t count) const {
    const long long segs = static_cast<long long>(ceil_div(count, ctx_.segment_elems())) + 2;
    return 4 + 2 * static_cast<long long>(p) * segs;
  }
  /// Reserves `span` ids (same order on every rank): their first; InvalidArgument when the ids
  /// run out.
  int take_ids(long long span) {
    const long long first = kFirstAlgorithmChannel + next_id_;
    DTRAIN_REQUIRE(first + span < INT_MAX, "allreduce",
                   "too many channel ids for the hierarchical schedule of "
                       << count_ << " elements; raise DTRAIN_COMM_SEGMENT_BYTES");
    next_id_ += span;
    return static_cast<int>(first);
  }

  // ---- the counter protocol of the node's segments (see shm.hpp) ------------------------------
  // Chunk g of this plan lives in slot g % slots; every rank raises its three counters of that
  // slot to g + 1 in order (0: its data is in its slot, 1: unused here beyond keeping the
  // counters in step for shm, 2: it has read what it needs of the other slots), so the counters
  // only grow and stay consistent with the shm algorithm's use of the same segments.
  void wait_counter(int q, int kind, int slot, std::uint64_t target) const {
    if (!counter_wait(seg_->flag(q, kind, slot), target, ctx_.deadline(), spin_, kFutexSliceSeconds,
                      ctx_.wait_progress()))
      ctx_.timeout(member(q));
  }
  /// Waits until every rank of the node has read chunk g - slots (whose slot chunk g reuses).
  void wait_slot_free(std::uint64_t g) const {
    const std::uint64_t S = static_cast<std::uint64_t>(seg_->slots);
    if (g < S) return;
    const int slot = static_cast<int>(g % S);
    for (int q = 0; q < node_size_; ++q) wait_counter(q, 2, slot, g - S + 1);
  }
  void raise_counter(int kind, std::uint64_t g) const {
    const int slot = static_cast<int>(g % static_cast<std::uint64_t>(seg_->slots));
    counter_publish(seg_->flag(local_rank_, kind, slot), g + 1);
  }
  /// Runs body(g, slot, c0, c1) for each slot-sized chunk [c0, c1) of the vector, chunk number
  /// g, then counts the chunks as used; with `finish` every counter of each chunk is raised after
  /// its body.
  template <class F>
  void for_each_chunk(bool finish, F&& body) {
    SharedSegments& w = *seg_;
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / elem_bytes_);
    const std::size_t nchunks = ceil_div(count_, chunk);
    for (std::size_t k = 0; k < nchunks; ++k) {
      const std::uint64_t g = w.next_chunk + k;
      body(g, static_cast<int>(g % static_cast<std::uint64_t>(w.slots)), k * chunk,
           std::min(count_, k * chunk + chunk));
      if (finish)
        for (int kind = 0; kind < 3; ++kind) raise_counter(kind, g);
    }
    w.next_chunk += nchunks;
  }
  /// The whole vector from the input to the output (a node of one rank).
  void copy_input() {
    if (in_ != out_) std::memcpy(out_, in_, count_ * elem_bytes_);
  }

  // ---- buffers read in place (see the top) ----------------------------------------------------
  /// Before raising counter 0 for the chunk in `slot` (after wait_slot_free): where the others
  /// find the chunk they read, `data` (`bytes`): true when it lies in this rank's heap (and
  /// `may`), and they read it there (the caller copies nothing); false when the caller copies it
  /// into its slot. The callers lend an input only out of place: in place, this rank would
  /// later overwrite the lines the others read from it, each write first taking the line back
  /// from their caches (shm.hpp measured that to cost what the saved copy gained).
  bool lend(int slot, const uchar* data, std::size_t bytes, bool may = true) {
    if (!lendable_) return false;
    Descriptor d;
    if (may && seg_->in_own_heap(data, bytes)) {
      d.direct = 1;
      d.at = seg_->own_heap_offset(data);
      lent_ = true;
      ++seg_->direct_chunks;
    }
    std::memcpy(seg_->slot(local_rank_, slot) + seg_->slot_bytes - kLine, &d, sizeof(d));
    return d.direct != 0;
  }
  /// Local rank q's chunk in `slot` (once its counter 0 for the chunk was seen): in its heap
  /// where it lent it, else its slot.
  const uchar* chunk_of(int q, int slot) const {
    if (lendable_) {
      Descriptor d;
      std::memcpy(&d, seg_->slot(q, slot) + seg_->slot_bytes - kLine, sizeof(d));
      if (d.direct) return seg_->heap_at(q, d.at);
    }
    return seg_->slot(q, slot);
  }
  /// At the end of run(), after the last chunk: where this rank lent a buffer, waits until every
  /// other rank of the node has raised counter 2 for that chunk (it has read all it reads); the
  /// caller may write the buffers once run() returns.
  void end_lending() {
    if (!lent_) return;
    lent_ = false;
    const std::uint64_t last = seg_->next_chunk - 1;
    const int slot = static_cast<int>(last % static_cast<std::uint64_t>(seg_->slots));
    for (int i = 1; i < node_size_; ++i)
      wait_counter((local_rank_ + i) % node_size_, 2, slot, last + 1);
  }

  PlanContext<Transport>& ctx_;
  const uchar* in_;
  uchar* out_;
  NodeMap nodes_;
  std::size_t count_, elem_bytes_;                 // elements of the vector, bytes of one
  int node_ = 0, node_size_ = 1, local_rank_ = 0;  // this rank's node, its ranks, rank in it
  SharedSegments* seg_ = nullptr;
  double spin_ = Backoff::kSpinSeconds;
  std::size_t chunk_bytes_ = 0;  // of the user's vector per chunk (shm_chunk_bytes)
  bool lendable_ = false;        // chunks leave the slot's last line for a descriptor
  bool lent_ = false;            // this run lent a buffer to the node (end_lending)
  ReduceOp group_op_ = ReduceOp::sum;
  long long next_id_ = 2;  // ids 0 and 1 (after kFirstAlgorithmChannel): intra-node messages

 private:
  // A chunk's descriptor in the slot's last line: whether the others read it in place, and its
  // offset in this rank's heap.
  struct Descriptor {
    std::size_t direct = 0;
    std::size_t at = 0;
  };
  static constexpr std::size_t kLine = 64;
  static_assert(sizeof(Descriptor) <= kLine, "a descriptor fits the slot's last line");
};

/// hier: intra-node reduce-scatter, inter-node ring all-reduce of each part, intra-node
/// all-gather.
template <class Transport>
class HierAlgorithm : public HierBase<Transport> {
  using Base = HierBase<Transport>;
  using uchar = typename Base::uchar;

 public:
  HierAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out)
      : Base(ctx, in, out, "hier") {
    const NodeMap& nm = this->nodes_;
    const int N = nm.nodes();
    lmax_ = nm.shape().max_ranks_per_node;
    if (this->count_ == 0) return;
    own0_ = range_begin(this->local_rank_, this->node_size_);
    own1_ = range_begin(this->local_rank_ + 1, this->node_size_);
    // (2) one group per part, numbered by part; ids reserved for every part on every rank.
    for (int j = 0; j < lmax_; ++j) {
      const std::size_t c0 = part_begin(j), c1 = part_begin(j + 1);
      const long long span = this->id_span(N, c1 - c0);
      const int ids = this->take_ids(span);
      if (N == 1 || j < first_part() || j >= first_part(this->local_rank_ + 1)) continue;
      std::vector<int> members;
      for (int k = 0; k < N; ++k) {
        const int Lk = nm.node_size(k);
        int q = 0;
        while (static_cast<int>(block_begin(lmax_, Lk, q + 1)) <= j) ++q;
        members.push_back(nm.members(k)[static_cast<std::size_t>(q)]);
      }
      auto g = std::make_unique<Group>();
      g->view = std::make_unique<PlanContext<Transport>>(
          ctx, std::move(members), c1 - c0, this->group_op_, ids, static_cast<int>(span));
      uchar* part = this->out_ + c0 * this->elem_bytes_;
      // Every owner of part j computes the same choice: same model, count and node count.
      g->algo = Base::make_inter(this->inter_choice(c1 - c0, N, AllreduceAlgorithm::ring), *g->view,
                                 part);
      groups_.push_back(std::move(g));
    }
    if (this->node_size_ > 1 && !this->seg_) plan_direct();
  }

  void run() override {
    const std::size_t n = this->count_, es = this->elem_bytes_;
    if (n == 0) return;
    auto& ctx = this->ctx_;
    if (this->node_size_ == 1) {
      this->copy_input();
    } else if (this->seg_) {
      shm_reduce_scatter();
    } else {
      direct_reduce_scatter();
    }
    for (auto& g : groups_) g->algo->run();
    if (own1_ > own0_) ctx.finish_avg(this->out_ + own0_ * es, own1_ - own0_);
    if (this->node_size_ == 1) return;
    if (this->seg_)
      shm_allgather();
    else
      direct_allgather();
  }

 private:
  struct Group {
    std::unique_ptr<PlanContext<Transport>> view;
    std::unique_ptr<Algorithm> algo;
  };

  std::size_t part_begin(int j) const noexcept {
    return block_begin(this->count_, static_cast<std::size_t>(lmax_), static_cast<std::size_t>(j));
  }
  /// First part of local rank q (of L) on this node.
  int first_part(int q) const noexcept {
    return static_cast<int>(block_begin(lmax_, this->node_size_, q));
  }
  int first_part() const noexcept { return first_part(this->local_rank_); }
  /// First element of local rank q of a node of L ranks.
  std::size_t range_begin(int q, int L) const noexcept {
    return part_begin(static_cast<int>(block_begin(lmax_, L, q)));
  }

  // ---- through the node's segments ------------------------------------------------------------
  void shm_reduce_scatter() {
    SharedSegments& w = *this->seg_;
    auto& ctx = this->ctx_;
    const std::size_t es = this->elem_bytes_;
    const int L = this->node_size_, l = this->local_rank_;
    this->for_each_chunk(true, [&](std::uint64_t g, int slot, std::size_t c0, std::size_t c1) {
      const std::size_t m0 = std::clamp(own0_, c0, c1), m1 = std::clamp(own1_, c0, c1);
      uchar* mine = w.slot(l, slot);
      this->wait_slot_free(g);
      // Everything but this rank's own range, which it reduces from its input directly.
      if (!this->lend(slot, this->in_ + c0 * es, (c1 - c0) * es, this->in_ != this->out_)) {
        if (m0 > c0) std::memcpy(mine, this->in_ + c0 * es, (m0 - c0) * es);
        if (c1 > m1) std::memcpy(mine + (m1 - c0) * es, this->in_ + m1 * es, (c1 - m1) * es);
      }
      this->raise_counter(0, g);
      uchar* dst = this->out_ + m0 * es;
      for (int i = 1; i < L; ++i) {
        const int q = (l + i) % L;
        this->wait_counter(q, 0, slot, g + 1);
        if (m1 > m0)
          ctx.reduce(dst, i == 1 ? this->in_ + m0 * es : dst,
                     this->chunk_of(q, slot) + (m0 - c0) * es, m1 - m0);
      }
    });
  }

  void shm_allgather() {
    SharedSegments& w = *this->seg_;
    const std::size_t es = this->elem_bytes_;
    const int L = this->node_size_, l = this->local_rank_;
    this->for_each_chunk(false, [&](std::uint64_t g, int slot, std::size_t c0, std::size_t c1) {
      const std::size_t m0 = std::clamp(own0_, c0, c1), m1 = std::clamp(own1_, c0, c1);
      this->wait_slot_free(g);
      if (!this->lend(slot, this->out_ + c0 * es, (c1 - c0) * es) && m1 > m0)
        std::memcpy(w.slot(l, slot) + (m0 - c0) * es, this->out_ + m0 * es, (m1 - m0) * es);
      this->raise_counter(0, g);
      this->raise_counter(1, g);
      for (int i = 1; i < L; ++i) {
        const int q = (l + i) % L;
        const std::size_t q0 = std::clamp(range_begin(q, L), c0, c1),
                          q1 = std::clamp(range_begin(q + 1, L), c0, c1);
        this->wait_counter(q, 0, slot, g + 1);
        if (q1 > q0)
          std::memcpy(this->out_ + q0 * es, this->chunk_of(q, slot) + (q0 - c0) * es,
                      (q1 - q0) * es);
      }
      this->raise_counter(2, g);
    });
    this->end_lending();
  }

  // ---- by messages inside the node ------------------------------------------------------------
  void plan_direct() {
    auto& ctx = this->ctx_;
    const int L = this->node_size_, l = this->local_rank_;
    const std::size_t es = this->elem_bytes_, mine = own1_ - own0_;
    const int rs_id = kFirstAlgorithmChannel, ag_id = kFirstAlgorithmChannel + 1;
    if (mine) recv_buf_ = ctx.scratch(static_cast<std::size_t>(L - 1) * mine * es);
    first_ = ctx.channel_count();
    for (int i = 1; i < L; ++i) {
      const int q = (l + i) % L, peer = this->member(q);
      const std::size_t q0 = range_begin(q, L), q1 = range_begin(q + 1, L);
      ctx.add_recv(peer, rs_id, recv_buf_ + static_cast<std::size_t>(i - 1) * mine * es, mine * es);
      ctx.add_send(peer, rs_id, this->in_ + q0 * es, (q1 - q0) * es);
      ctx.add_recv(peer, ag_id, this->out_ + q0 * es, (q1 - q0) * es);
      ctx.add_send(peer, ag_id, this->out_ + own0_ * es, mine * es);
    }
  }
  // Channel of peer i (1..L-1): 0 reduce-scatter receive, 1 send, 2 all-gather receive, 3 send.
  std::size_t chan(int i, int which) const noexcept {
    return first_ + 4 * static_cast<std::size_t>(i - 1) + static_cast<std::size_t>(which);
  }

  void direct_reduce_scatter() {
    auto& ctx = this->ctx_;
    const int L = this->node_size_;
    const std::size_t es = this->elem_bytes_, mine = own1_ - own0_;
    for (int i = 1; i < L; ++i) ctx.start(chan(i, 0));
    for (int i = 1; i < L; ++i) ctx.start(chan(i, 1));
    uchar* dst = this->out_ + own0_ * es;
    for (int i = 1; i < L; ++i) {
      ctx.wait(chan(i, 0));
      if (mine)
        ctx.reduce(dst, i == 1 ? this->in_ + own0_ * es : dst,
                   recv_buf_ + static_cast<std::size_t>(i - 1) * mine * es, mine);
    }
    for (int i = 1; i < L; ++i) ctx.wait(chan(i, 1));
  }

  void direct_allgather() {
    auto& ctx = this->ctx_;
    const int L = this->node_size_;
    for (int i = 1; i < L; ++i) ctx.start(chan(i, 2));
    for (int i = 1; i < L; ++i) ctx.start(chan(i, 3));
    for (int i = 1; i < L; ++i) ctx.wait(chan(i, 2));
    for (int i = 1; i < L; ++i) ctx.wait(chan(i, 3));
  }

  int lmax_ = 1;
  std::size_t own0_ = 0, own1_ = 0;  // this rank's elements after the intra-node reduce-scatter
  std::vector<std::unique_ptr<Group>> groups_;
  uchar* recv_buf_ = nullptr;
  std::size_t first_ = 0;
};

/// hier_leader: intra-node reduce to the node's lowest rank, recursive doubling among the
/// leaders, intra-node broadcast.
template <class Transport>
class HierLeaderAlgorithm : public HierBase<Transport> {
  using Base = HierBase<Transport>;
  using uchar = typename Base::uchar;

 public:
  HierLeaderAlgorithm(PlanContext<Transport>& ctx, const void* in, void* out)
      : Base(ctx, in, out, "hier_leader") {
    const NodeMap& nm = this->nodes_;
    const int N = nm.nodes();
    const std::size_t n = this->count_, es = this->elem_bytes_;
    if (n == 0) return;
    const long long span = this->id_span(N, n);
    const int ids = this->take_ids(span);
    if (N > 1 && this->local_rank_ == 0) {
      std::vector<int> leaders;
      for (int k = 0; k < N; ++k) leaders.push_back(nm.members(k)[0]);
      view_ = std::make_unique<PlanContext<Transport>>(ctx, std::move(leaders), n, this->group_op_,
                                                       ids, static_cast<int>(span));
      inter_ =
          Base::make_inter(this->inter_choice(n, N, AllreduceAlgorithm::rd), *view_, this->out_);
    }
    if (this->node_size_ == 1 || this->seg_) return;
    const int L = this->node_size_;
    const int up = kFirstAlgorithmChannel, down = kFirstAlgorithmChannel + 1;
    first_ = ctx.channel_count();
    if (this->local_rank_ == 0) {
      recv_buf_ = ctx.scratch(static_cast<std::size_t>(L - 1) * n * es);
      for (int q = 1; q < L; ++q) {
        ctx.add_recv(this->member(q), up, recv_buf_ + static_cast<std::size_t>(q - 1) * n * es,
                     n * es);
        ctx.add_send(this->member(q), down, this->out_, n * es);
      }
    } else {
      ctx.add_send(this->member(0), up, this->in_, n * es);
      ctx.add_recv(this->member(0), down, this->out_, n * es);
    }
  }

  void run() override {
    const std::size_t n = this->count_, es = this->elem_bytes_;
    if (n == 0) return;
    auto& ctx = this->ctx_;
    const bool leader = this->local_rank_ == 0;
    if (this->node_size_ == 1) {
      this->copy_input();
    } else if (this->seg_) {
      shm_reduce();
    } else if (leader) {
      for (int q = 1; q < this->node_size_; ++q) ctx.start(first_ + 2 * (q - 1));
      for (int q = 1; q < this->node_size_; ++q) {
        ctx.wait(first_ + 2 * (q - 1));
        ctx.reduce(this->out_, q == 1 ? this->in_ : this->out_,
                   recv_buf_ + static_cast<std::size_t>(q - 1) * n * es, n);
      }
    } else {
      ctx.start(first_ + 1);  // the result's receive, posted early
      ctx.start(first_);
      ctx.wait(first_);
    }
    if (leader) {
      if (inter_) inter_->run();
      ctx.finish_avg(this->out_, n);
    }
    if (this->node_size_ == 1) return;
    if (this->seg_) {
      shm_broadcast();
    } else if (leader) {
      for (int q = 1; q < this->node_size_; ++q) ctx.start(first_ + 2 * (q - 1) + 1);
      for (int q = 1; q < this->node_size_; ++q) ctx.wait(first_ + 2 * (q - 1) + 1);
    } else {
      ctx.wait(first_ + 1);
    }
  }

 private:
  // Every rank raises all three counters of a chunk once done with it (the leader after reading
  // the other slots, the others after filling theirs / reading the leader's).
  void shm_reduce() {
    SharedSegments& w = *this->seg_;
    auto& ctx = this->ctx_;
    const std::size_t es = this->elem_bytes_;
    this->for_each_chunk(true, [&](std::uint64_t g, int slot, std::size_t c0, std::size_t c1) {
      const std::size_t cl = c1 - c0;
      this->wait_slot_free(g);
      if (this->local_rank_ != 0) {
        if (!this->lend(slot, this->in_ + c0 * es, cl * es, this->in_ != this->out_))
          std::memcpy(w.slot(this->local_rank_, slot), this->in_ + c0 * es, cl * es);
      } else {
        uchar* dst = this->out_ + c0 * es;
        for (int q = 1; q < this->node_size_; ++q) {
          this->wait_counter(q, 0, slot, g + 1);
          ctx.reduce(dst, q == 1 ? this->in_ + c0 * es : dst, this->chunk_of(q, slot), cl);
        }
      }
    });
    // A rank's input lent here has been read once the leader publishes the broadcast's first
    // chunk, which every rank waits for: nothing to wait for at the end for it.
    this->lent_ = false;
  }

  void shm_broadcast() {
    SharedSegments& w = *this->seg_;
    const std::size_t es = this->elem_bytes_;
    this->for_each_chunk(true, [&](std::uint64_t g, int slot, std::size_t c0, std::size_t c1) {
      const std::size_t cl = c1 - c0;
      if (this->local_rank_ == 0) {
        this->wait_slot_free(g);
        if (!this->lend(slot, this->out_ + c0 * es, cl * es))
          std::memcpy(w.slot(0, slot), this->out_ + c0 * es, cl * es);
      } else {
        this->wait_counter(0, 0, slot, g + 1);
        std::memcpy(this->out_ + c0 * es, this->chunk_of(0, slot), cl * es);
      }
    });
    this->end_lending();
  }

  std::unique_ptr<PlanContext<Transport>> view_;
  std::unique_ptr<Algorithm> inter_;
  uchar* recv_buf_ = nullptr;
  std::size_t first_ = 0;
};

}  // namespace dtrain::detail
