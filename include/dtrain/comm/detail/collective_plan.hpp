// dtrain: planned collectives. A plan fixes buffers, sizes, algorithm, segment layout, scratch
// memory and request slots at construction, so execution allocates nothing.
//
// Algorithms (p ranks, N elements, rank r):
//  - ring: reduce-scatter then all-gather around the ring r -> r+1, 2(p-1) steps. Each block is
//    cut into segments; a segment is reduced as soon as it arrives and forwarded at once, so
//    reduction of one segment overlaps the transfer of the next (software pipeline).
//  - tree: pipelined double binary tree. Tree 0 is an in-order binary tree over positions
//    1..p-1 (node x with lowest set bit b has children x-b/2 and x+b/2, or the next smaller
//    offset that exists) hung below position 0; odd positions are its leaves. Tree 1 maps
//    positions to ranks shifted by one (p even) or mirrored (p odd), which turns the leaves of
//    tree 0 into the interior nodes of tree 1. Each tree carries half the data, segment by
//    segment, up (reduce) and down (broadcast) at once; since a rank is interior in (about) one
//    tree only, it moves about N up and N down in total: bandwidth close to the ring's with
//    O(log p) instead of O(p) latency.
//  - rhd: Rabenseifner. With p' the largest power of two <= p and q = p - p', the first 2q
//    ranks fold pairwise (even sends to odd, odd reduces), the p' remaining ranks run recursive
//    halving (reduce-scatter) then recursive doubling (all-gather), and the odd ranks hand the
//    result back. Each step is segmented so reduction overlaps arrival.
//  - rd: recursive doubling of the whole vector with the same fold: lg p' steps.
//  - shm: through node-shared segments (see run_shm), when the transport offers them.
//  - broadcast: binomial tree, pipelined by segments.
// avg is a sum divided by p exactly once, by the rank that finishes each element, so every rank
// ends with the same bits. 16-bit floats are widened to f32 once, reduced in f32 and rounded once.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/detail/fingerprint.hpp>
#include <dtrain/comm/detail/progress_engine.hpp>
#include <dtrain/comm/detail/reduce_kernels.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>

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

/// One planned collective on fixed buffers. Created by Communicator; executed by the caller's
/// thread or the progress thread, never both at once.
template <class Transport>
class PlanImpl final : public Job {
  using Request = typename Transport::Request;
  using uchar = unsigned char;

 public:
  struct Spec {
    CollectiveKind kind = CollectiveKind::barrier;
    AllreduceAlgorithm algo = AllreduceAlgorithm::ring;
    ReduceOp op = ReduceOp::sum;
    DType dtype = DType::f32;
    std::size_t count = 0;  // elements of the full vector (allreduce, broadcast, reduce_scatter
                            // input, allgather output)
    const void* in = nullptr;
    void* out = nullptr;
    int root = 0;
  };

  PlanImpl(CommState<Transport>& comm, const Spec& s) : comm_(&comm), s_(s) {
    Transport& t = *comm.transport;
    p_ = t.size();
    r_ = t.rank();
    widen_ = (s.dtype == DType::f16 || s.dtype == DType::bf16) &&
             (s.kind == CollectiveKind::allreduce || s.kind == CollectiveKind::reduce_scatter);
    wdtype_ = widen_ ? DType::f32 : s.dtype;
    es_ = size_of(wdtype_);
    const std::size_t seg_bytes = std::max<std::size_t>(comm.config.segment_bytes, 64);
    seg_elems_ = std::max<std::size_t>(1, seg_bytes / es_);
    const std::size_t n = s.count;
    if (widen_) wide_in_.resize(n * 4);
    std::size_t nreq = 2;  // fingerprint exchange
    if (p_ > 1) {
      switch (s.kind) {
        case CollectiveKind::barrier:
        case CollectiveKind::calibrate: break;
        case CollectiveKind::broadcast: {
          nseg_ = ceil_div(n, seg_elems_);
          int kids = 0;
          for (int m = 1; m < p_; m <<= 1) ++kids;
          nreq += nseg_ * (1 + static_cast<std::size_t>(kids));
          break;
        }
        case CollectiveKind::allgather:
        case CollectiveKind::reduce_scatter:
          setup_ring(n, false, nreq);
          if (s.kind == CollectiveKind::reduce_scatter) scratch_.resize(n * es_);
          break;
        case CollectiveKind::allreduce:
          switch (s.algo) {
            case AllreduceAlgorithm::ring: setup_ring(n, widen_ || s.in == s.out, nreq); break;
            case AllreduceAlgorithm::tree: setup_tree(n, nreq); break;
            case AllreduceAlgorithm::rhd:
            case AllreduceAlgorithm::rd: setup_rhd(n, nreq); break;
            case AllreduceAlgorithm::shm:
              seg_ = shared_segments_of(*comm.transport);
              DTRAIN_REQUIRE(seg_ != nullptr, "allreduce",
                             "algorithm shm needs a transport with node-shared segments (all "
                             "ranks on one node, DTRAIN_SHM not 0)");
              break;
            case AllreduceAlgorithm::automatic:
              raise<InvalidArgument>("allreduce plan",
                                     "algorithm must be resolved before planning");
          }
          break;
      }
    }
    nreq_ = nreq;
    reqs_.reset(new Request[nreq_]);
    // Registration hook: everything this plan will ever send from or receive into.
    register_range(const_cast<void*>(s.in), in_bytes());
    register_range(s.out, out_bytes());
    register_range(wide_in_.data(), wide_in_.size());
    register_range(scratch_.data(), scratch_.size());
    register_range(tmp_.data(), tmp_.size());
    register_range(&check_mine_, sizeof(CheckState));
    register_range(&check_peer_, sizeof(CheckState));
  }

  ~PlanImpl() override {
    // A started plan must finish before its buffers go away.
    const int st = status.load();
    if ((st == queued || st == running) && engine) {
      try {
        engine->wait(*this);
      } catch (...) {
      }
    }
    for (auto& m : regions_) comm_->transport->deregister_memory(m);
  }

  std::string label() const override {
    Fingerprint f = make_fingerprint(s_.kind, seq_, s_.count, s_.dtype, s_.op, s_.algo, s_.root);
    return operation_label(f);
  }

  const Spec& spec() const noexcept { return s_; }
  CommState<Transport>* state() const noexcept { return comm_; }

  /// Executes the collective once (blocking, on the calling thread).
  void run() override {
    comm_->check_usable(name_of(s_.kind));
    seq_ = comm_->seq.fetch_add(1);
    fp_ = make_fingerprint(s_.kind, seq_, s_.count, s_.dtype, s_.op, s_.algo, s_.root);
    deadline_ = Deadline(comm_->config.timeout_s);
    tag_ = static_cast<int>((seq_ % 4096) * 8);
    if (p_ == 1) {
      run_single();
      return;
    }
    try {
      if (comm_->config.check_fingerprints || s_.kind == CollectiveKind::barrier) check();
      body();
    } catch (const std::exception& e) {
      cancel_all();
      comm_->mark_broken(e.what());
      throw;
    }
  }

  // Calibration helpers are public for the communicator's cost-model measurement.
  Transport& transport() noexcept { return *comm_->transport; }
  Request& request(std::size_t i) noexcept { return reqs_[i]; }
  void wait_req(Request& q, int peer) {
    if (!comm_->transport->wait_until(q, deadline_))
      raise<TimeoutError>(operation_label(fp_), concat("wait for rank ", peer, " timed out after ",
                                                       deadline_.budget(), " s"));
  }

 private:
  static std::size_t ceil_div(std::size_t a, std::size_t b) noexcept {
    return a == 0 ? 0 : (a + b - 1) / b;
  }

  std::size_t in_bytes() const noexcept {
    switch (s_.kind) {
      case CollectiveKind::allgather:
        return (block_begin(s_.count, p_, r_ + 1) - block_begin(s_.count, p_, r_)) *
               size_of(s_.dtype);
      case CollectiveKind::allreduce:
      case CollectiveKind::reduce_scatter: return s_.count * size_of(s_.dtype);
      default: return 0;
    }
  }
  std::size_t out_bytes() const noexcept {
    switch (s_.kind) {
      case CollectiveKind::reduce_scatter:
        return (block_begin(s_.count, p_, r_ + 1) - block_begin(s_.count, p_, r_)) *
               size_of(s_.dtype);
      case CollectiveKind::barrier:
      case CollectiveKind::calibrate: return 0;
      default: return s_.count * size_of(s_.dtype);
    }
  }

  void register_range(void* p, std::size_t bytes) {
    if (!p || !bytes) return;
    regions_.push_back(comm_->transport->register_memory(p, bytes, Space::host));
  }

  void cancel_all() noexcept {
    for (std::size_t i = 0; i < nreq_; ++i) comm_->transport->cancel(reqs_[i]);
  }

  void isend(Request& q, int peer, int sub, const void* data, std::size_t bytes) {
    comm_->transport->isend(q, peer, tag_ + sub, data, bytes);
  }
  void irecv(Request& q, int peer, int sub, void* data, std::size_t bytes) {
    comm_->transport->irecv(q, peer, tag_ + sub, data, bytes);
  }

  // ---- fingerprint exchange (also the barrier): dissemination, ceil(log2 p) rounds ----------
  void check() {
    Transport& t = *comm_->transport;
    check_mine_ = CheckState{};
    check_mine_.seen = fp_;
    check_mine_.seen_rank = r_;
    Request& rq = reqs_[0];
    Request& sq = reqs_[1];
    for (int d = 1; d < p_; d <<= 1) {
      const int to = (r_ + d) % p_, from = (r_ - d + p_) % p_;
      // A constant tag: a rank that skipped a call still meets its peers here and the sequence
      // numbers in the fingerprints tell what went wrong.
      t.irecv(rq, from, 0, &check_peer_, sizeof(CheckState));
      t.isend(sq, to, 0, &check_mine_, sizeof(CheckState));
      wait_req(rq, from);
      wait_req(sq, to);
      check_mine_.merge(check_peer_);
    }
    if (check_mine_.mismatch)
      raise<RemoteError>(operation_label(fp_),
                         concat("mismatched collective calls: rank ", check_mine_.a_rank,
                                " called ", describe(check_mine_.a), " but rank ",
                                check_mine_.b_rank, " called ", describe(check_mine_.b)));
  }

  // ---- dispatch -------------------------------------------------------------------------------
  void run_single() {
    const std::size_t bytes = out_bytes();
    const void* in = s_.kind == CollectiveKind::broadcast ? s_.out : s_.in;
    if (bytes && in != s_.out) std::memcpy(s_.out, in, bytes);
  }

  void body() {
    const std::size_t n = s_.count;
    switch (s_.kind) {
      case CollectiveKind::barrier:
      case CollectiveKind::calibrate: return;
      case CollectiveKind::broadcast: run_broadcast(static_cast<uchar*>(s_.out)); return;
      case CollectiveKind::allgather: {
        const std::size_t b0 = block_begin(n, p_, r_), b1 = block_begin(n, p_, r_ + 1);
        uchar* out = static_cast<uchar*>(s_.out);
        if (b1 > b0 && out + b0 * es_ != s_.in)
          std::memmove(out + b0 * es_, s_.in, (b1 - b0) * es_);
        run_ring(out, out, false, true);
        return;
      }
      case CollectiveKind::reduce_scatter: {
        const uchar* in = static_cast<const uchar*>(s_.in);
        if (widen_) {
          widen_to_f32(reinterpret_cast<float*>(wide_in_.data()), s_.in, n, s_.dtype);
          in = wide_in_.data();
        }
        run_ring(in, scratch_.data(), true, false);
        const std::size_t b0 = block_begin(n, p_, r_), b1 = block_begin(n, p_, r_ + 1);
        if (b1 > b0) {
          if (widen_)
            narrow_from_f32(s_.out, reinterpret_cast<const float*>(scratch_.data()) + b0, b1 - b0,
                            s_.dtype);
          else
            std::memcpy(s_.out, scratch_.data() + b0 * es_, (b1 - b0) * es_);
        }
        return;
      }
      case CollectiveKind::allreduce: {
        const uchar* in = static_cast<const uchar*>(s_.in);
        uchar* out = static_cast<uchar*>(s_.out);
        if (widen_) {
          widen_to_f32(reinterpret_cast<float*>(wide_in_.data()), s_.in, n, s_.dtype);
          in = out = wide_in_.data();
        }
        switch (s_.algo) {
          case AllreduceAlgorithm::ring: run_ring(in, out, true, true); break;
          case AllreduceAlgorithm::tree: run_tree(in, out); break;
          case AllreduceAlgorithm::rhd: run_rhd(in, out, false); break;
          case AllreduceAlgorithm::rd: run_rhd(in, out, true); break;
          case AllreduceAlgorithm::shm: run_shm(in, out); break;
          case AllreduceAlgorithm::automatic: DTRAIN_ASSERT(false);
        }
        if (widen_) narrow_from_f32(s_.out, reinterpret_cast<const float*>(out), n, s_.dtype);
        return;
      }
    }
  }

  // ---- ring -------------------------------------------------------------------------------------
  void setup_ring(std::size_t n, bool inplace_reduce, std::size_t& nreq) {
    max_block_ = ceil_div(n, static_cast<std::size_t>(p_));
    nseg_ = std::max<std::size_t>(1, ceil_div(max_block_, seg_elems_));
    ring_base_ = nreq;
    nreq += 4 * nseg_;
    // In-place reduce-scatter receives into two alternating block-sized buffers.
    if (inplace_reduce) tmp_.resize(2 * max_block_ * es_);
  }

  int mod_p(long x) const noexcept {
    const long p = p_;
    return static_cast<int>(((x % p) + p) % p);
  }

  void seg_of_block(int b, std::size_t c, std::size_t& off, std::size_t& len) const noexcept {
    const std::size_t n = s_.count;
    const std::size_t b0 = block_begin(n, p_, b), bl = block_begin(n, p_, b + 1) - b0;
    off = b0 + block_begin(bl, nseg_, c);
    len = b0 + block_begin(bl, nseg_, c + 1) - off;
  }

  // Rank r owns block r after the reduce-scatter steps. Step t < Trs sends block r-t-1 and
  // receives block r-t-2; all-gather step s sends block r-s and receives block r-s-1.
  void run_ring(const uchar* in, uchar* work, bool rs, bool ag) {
    const int p = p_, r = r_;
    const int left = mod_p(r - 1), right = mod_p(r + 1);
    const int trs = rs ? p - 1 : 0, steps = trs + (ag ? p - 1 : 0);
    if (steps == 0 || s_.count == 0) return;
    const bool inplace = in == work;
    const std::size_t nseg = nseg_;
    Request* rq = &reqs_[ring_base_];
    auto RQ = [&](int t, std::size_t c) -> Request& { return rq[(t & 1) * nseg + c]; };
    auto SQ = [&](int t, std::size_t c) -> Request& { return rq[2 * nseg + (t & 1) * nseg + c]; };
    auto send_block = [&](int t) { return t < trs ? mod_p(r - t - 1) : mod_p(r - (t - trs)); };
    auto recv_block = [&](int t) { return t < trs ? mod_p(r - t - 2) : mod_p(r - (t - trs) - 1); };
    auto tmp_ptr = [&](int t, int b, std::size_t off) {
      return tmp_.data() + ((t & 1) * max_block_ + (off - block_begin(s_.count, p, b))) * es_;
    };
    auto post_recv = [&](int t, std::size_t c) {
      const int b = recv_block(t);
      std::size_t off, len;
      seg_of_block(b, c, off, len);
      if (!len) return;
      uchar* dst = (t < trs && inplace) ? tmp_ptr(t, b, off) : work + off * es_;
      irecv(RQ(t, c), left, 1, dst, len * es_);
    };
    auto post_send = [&](int t, std::size_t c) {
      std::size_t off, len;
      seg_of_block(send_block(t), c, off, len);
      if (!len) return;
      const uchar* src = (t == 0 && rs) ? in : work;
      isend(SQ(t, c), right, 1, src + off * es_, len * es_);
    };
    const bool avg = s_.op == ReduceOp::avg;
    for (std::size_t c = 0; c < nseg; ++c) post_recv(0, c);
    for (std::size_t c = 0; c < nseg; ++c) post_send(0, c);
    for (int t = 0; t < steps; ++t) {
      for (std::size_t c = 0; c < nseg; ++c) {
        wait_req(RQ(t, c), left);
        if (t < trs) {
          const int b = recv_block(t);
          std::size_t off, len;
          seg_of_block(b, c, off, len);
          if (len) {
            uchar* dst = work + off * es_;
            const uchar* other = inplace ? tmp_ptr(t, b, off) : in + off * es_;
            reduce_into(dst, dst, other, len, wdtype_, s_.op);
            if (avg && t == trs - 1) finalize_avg(dst, len, wdtype_, p);
          }
        }
        if (t + 1 < steps) {
          // With two ranks the next receive lands where this step's send reads from.
          if (p == 2) wait_req(SQ(t, c), right);
          post_recv(t + 1, c);
          wait_req(SQ(t + 1, c), right);  // the slot's previous send (step t-1)
          post_send(t + 1, c);
        }
      }
    }
    for (std::size_t c = 0; c < nseg; ++c) {
      wait_req(SQ(steps - 1, c), right);
      if (steps >= 2) wait_req(SQ(steps - 2, c), right);
    }
  }

  // ---- double binary tree --------------------------------------------------------------------
  static constexpr std::size_t kTreeWindow = 4;

  void setup_tree(std::size_t n, std::size_t& nreq) {
    half_ = block_begin(n, 2, 1);
    nseg_ = std::max<std::size_t>(1, ceil_div(n - half_ > half_ ? n - half_ : half_, seg_elems_));
    int depth = 0;
    while ((1 << depth) < p_) ++depth;
    tree_lag_ = 2 * depth + 2;
    for (int k = 0; k < 2; ++k) links_[k] = tree_links(k, r_, p_);
    tree_base_ = nreq;
    tree_per_ = 2 * kTreeWindow + 4 * nseg_;
    nreq += 2 * tree_per_;
    const std::size_t seg_cap = std::min(seg_elems_, std::max<std::size_t>(1, half_));
    tree_slot_elems_ = seg_cap;
    tmp_.resize(2 * 2 * kTreeWindow * seg_cap * es_);
    down_posted_.assign(2 * nseg_, 0);
  }

  void tree_seg(int k, std::size_t c, std::size_t& off, std::size_t& len) const noexcept {
    const std::size_t base = k ? half_ : 0, total = k ? s_.count - half_ : half_;
    off = base + block_begin(total, nseg_, c);
    len = base + block_begin(total, nseg_, c + 1) - off;
  }

  void run_tree(const uchar* in, uchar* out) {
    if (s_.count == 0) return;
    const std::size_t nseg = nseg_, W = kTreeWindow;
    const bool avg = s_.op == ReduceOp::avg;
    auto base = [&](int k) { return &reqs_[tree_base_ + k * tree_per_]; };
    auto child_recv = [&](int k, int ch, std::size_t c) -> Request& {
      return base(k)[ch * W + c % W];
    };
    auto up_send = [&](int k, std::size_t c) -> Request& { return base(k)[2 * W + c]; };
    auto down_recv = [&](int k, std::size_t c) -> Request& { return base(k)[2 * W + nseg + c]; };
    auto down_send = [&](int k, int ch, std::size_t c) -> Request& {
      return base(k)[2 * W + 2 * nseg + ch * nseg + c];
    };
    auto slot = [&](int k, int ch, std::size_t c) {
      return tmp_.data() + (((k * 2 + ch) * W + c % W) * tree_slot_elems_) * es_;
    };
    auto post_child = [&](int k, int ch, std::size_t c) {
      if (c >= nseg) return;
      std::size_t off, len;
      tree_seg(k, c, off, len);
      if (len)
        irecv(child_recv(k, ch, c), links_[k].children[ch], 1 + k, slot(k, ch, c), len * es_);
    };
    // Whether this rank's upward message for the segment was read from `out` (then the
    // downward receive into `out` must wait for it).
    auto sends_from_out = [&](int k) { return links_[k].nchildren > 0 || in == out; };
    auto up = [&](int k, std::size_t c) {
      const TreeLinks& L = links_[k];
      std::size_t off, len;
      tree_seg(k, c, off, len);
      const uchar* src = in + off * es_;
      uchar* dst = out + off * es_;
      for (int ch = 0; ch < L.nchildren; ++ch) {
        wait_req(child_recv(k, ch, c), L.children[ch]);
        if (len) reduce_into(dst, ch == 0 ? src : dst, slot(k, ch, c), len, wdtype_, s_.op);
        post_child(k, ch, c + W);
      }
      if (L.parent < 0) {
        if (len && L.nchildren == 0 && src != dst) std::memcpy(dst, src, len * es_);
        if (avg && len) finalize_avg(dst, len, wdtype_, p_);
        for (int ch = 0; ch < L.nchildren; ++ch)
          if (len) isend(down_send(k, ch, c), L.children[ch], 1 + k, dst, len * es_);
      } else if (len) {
        isend(up_send(k, c), L.parent, 1 + k, L.nchildren ? dst : src, len * es_);
      }
    };
    auto post_down = [&](int k, std::size_t c) {
      const TreeLinks& L = links_[k];
      if (L.parent < 0 || down_posted_[k * nseg + c]) return;
      std::size_t off, len;
      tree_seg(k, c, off, len);
      if (sends_from_out(k)) wait_req(up_send(k, c), L.parent);
      if (len) irecv(down_recv(k, c), L.parent, 1 + k, out + off * es_, len * es_);
      down_posted_[k * nseg + c] = 1;
    };
    auto down = [&](int k, std::size_t c) {
      const TreeLinks& L = links_[k];
      if (L.parent < 0) return;
      post_down(k, c);
      wait_req(down_recv(k, c), L.parent);
      std::size_t off, len;
      tree_seg(k, c, off, len);
      for (int ch = 0; ch < L.nchildren; ++ch)
        if (len) isend(down_send(k, ch, c), L.children[ch], 1 + k, out + off * es_, len * es_);
    };
    std::fill(down_posted_.begin(), down_posted_.end(), 0);
    for (int k = 0; k < 2; ++k)
      for (int ch = 0; ch < links_[k].nchildren; ++ch)
        for (std::size_t c = 0; c < std::min(W, nseg); ++c) post_child(k, ch, c);
    const std::size_t lag = tree_lag_;
    for (std::size_t it = 0; it < nseg + lag; ++it) {
      if (it < nseg)
        for (int k = 0; k < 2; ++k) up(k, it);
      if (it >= 1 && it - 1 < nseg)
        for (int k = 0; k < 2; ++k) post_down(k, it - 1);
      if (it >= lag && it - lag < nseg)
        for (int k = 0; k < 2; ++k) down(k, it - lag);
    }
    for (int k = 0; k < 2; ++k) {
      for (std::size_t c = 0; c < nseg; ++c) {
        if (links_[k].parent >= 0) wait_req(up_send(k, c), links_[k].parent);
        for (int ch = 0; ch < links_[k].nchildren; ++ch)
          wait_req(down_send(k, ch, c), links_[k].children[ch]);
      }
    }
  }

  // ---- recursive halving / doubling (rhd) and recursive doubling (rd) ----------------------
  void setup_rhd(std::size_t n, std::size_t& nreq) {
    rhd_base_ = nreq;
    rhd_slots_ = std::max<std::size_t>(1, ceil_div(n, seg_elems_) + 1);
    nreq += 2 * rhd_slots_ + 2;
    tmp_.resize(n * es_);
  }

  // Sends [soff, soff+slen) of `src` and receives [roff, roff+rlen) into `dst` from the same
  // partner, segment by segment; `on_segment(off, len)` runs as each received segment lands.
  template <class F>
  void exchange(int partner, const uchar* src, std::size_t soff, std::size_t slen, uchar* dst,
                std::size_t roff, std::size_t rlen, F&& on_segment) {
    Request* rq = &reqs_[rhd_base_];
    Request* sq = rq + rhd_slots_;
    const std::size_t ns = std::max<std::size_t>(1, ceil_div(slen, seg_elems_));
    const std::size_t nr = std::max<std::size_t>(1, ceil_div(rlen, seg_elems_));
    DTRAIN_ASSERT(ns <= rhd_slots_ && nr <= rhd_slots_);
    for (std::size_t c = 0; c < nr; ++c) {
      const std::size_t o = block_begin(rlen, nr, c), l = block_begin(rlen, nr, c + 1) - o;
      if (l) irecv(rq[c], partner, 1, dst + (roff + o) * es_, l * es_);
    }
    for (std::size_t c = 0; c < ns; ++c) {
      const std::size_t o = block_begin(slen, ns, c), l = block_begin(slen, ns, c + 1) - o;
      if (l) isend(sq[c], partner, 1, src + (soff + o) * es_, l * es_);
    }
    for (std::size_t c = 0; c < nr; ++c) {
      const std::size_t o = block_begin(rlen, nr, c), l = block_begin(rlen, nr, c + 1) - o;
      wait_req(rq[c], partner);
      if (l) on_segment(roff + o, l);
    }
    for (std::size_t c = 0; c < ns; ++c) wait_req(sq[c], partner);
  }

  void run_rhd(const uchar* in, uchar* out, bool doubling_only) {
    const std::size_t n = s_.count;
    if (n == 0) return;
    const int p = p_, r = r_;
    int pp = 1;
    while (pp * 2 <= p) pp *= 2;
    const int q = p - pp;
    const bool avg = s_.op == ReduceOp::avg;
    const uchar* src = in;
    int v;  // rank among the pp ranks that run the power-of-two part; -1 if folded out
    Request& fold_r = reqs_[rhd_base_ + 2 * rhd_slots_];
    Request& fold_s = reqs_[rhd_base_ + 2 * rhd_slots_ + 1];
    if (r < 2 * q) {
      if (r % 2 == 0) {
        isend(fold_s, r + 1, 3, in, n * es_);
        wait_req(fold_s, r + 1);
        irecv(fold_r, r + 1, 3, out, n * es_);
        wait_req(fold_r, r + 1);
        return;
      }
      irecv(fold_r, r - 1, 3, tmp_.data(), n * es_);
      wait_req(fold_r, r - 1);
      reduce_into(out, in, tmp_.data(), n, wdtype_, s_.op);
      src = out;
      v = r / 2;
    } else {
      v = r - q;
    }
    auto real = [&](int vr) { return vr < q ? 2 * vr + 1 : vr + q; };
    auto reduce_seg = [&](std::size_t off, std::size_t len) {
      reduce_into(out + off * es_, src + off * es_, tmp_.data() + off * es_, len, wdtype_, s_.op);
    };
    if (doubling_only) {
      if (src != out) std::memcpy(out, src, n * es_);
      for (int m = 1; m < pp; m <<= 1) {
        const int partner = real(v ^ m);
        exchange(partner, out, 0, n, tmp_.data(), 0, n, [](std::size_t, std::size_t) {});
        reduce_into(out, out, tmp_.data(), n, wdtype_, s_.op);
      }
      if (avg) finalize_avg(out, n, wdtype_, p);
    } else {
      // Recursive halving: keep the half on this rank's side of each mask bit.
      std::size_t lo = 0, hi = n;
      int step = 0;
      for (int m = pp / 2; m >= 1; m /= 2, ++step) {
        const int partner = real(v ^ m);
        const std::size_t mid = lo + (hi - lo) / 2;
        const bool lower = (v & m) == 0;
        const std::size_t klo = lower ? lo : mid, khi = lower ? mid : hi;
        const std::size_t slo = lower ? mid : lo, shi = lower ? hi : mid;
        rhd_lo_[step] = lo;
        rhd_hi_[step] = hi;
        exchange(partner, src, slo, shi - slo, tmp_.data(), klo, khi - klo,
                 [&](std::size_t off, std::size_t len) { reduce_seg(off, len); });
        // Parts of `out` outside [klo, khi) are not written yet, so later steps read `out` only
        // inside the kept range.
        src = out;
        lo = klo;
        hi = khi;
      }
      if (src != out && hi > lo) std::memcpy(out + lo * es_, src + lo * es_, (hi - lo) * es_);
      if (avg) finalize_avg(out + lo * es_, hi - lo, wdtype_, p);
      // Recursive doubling all-gather, the halving steps in reverse.
      for (int m = 1; m < pp; m <<= 1) {
        --step;
        const int partner = real(v ^ m);
        const std::size_t plo = rhd_lo_[step], phi = rhd_hi_[step];
        // This rank holds [lo, hi); the partner holds the rest of [plo, phi).
        const std::size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;
        exchange(partner, out, lo, hi - lo, out, olo, ohi - olo, [](std::size_t, std::size_t) {});
        lo = plo;
        hi = phi;
      }
    }
    if (r < 2 * q) {  // hand the result back to the folded-out partner
      isend(fold_s, r - 1, 3, out, n * es_);
      wait_req(fold_s, r - 1);
    }
  }

  // ---- shm: reduce-scatter + all-gather through node-shared segments ------------------------
  // The vector goes through in chunks of one slot. For chunk g (numbered across collectives, so
  // the counters only grow) in slot s = g % slots, every rank copies into its own slot the parts
  // of its input chunk that the other ranks reduce (partition q of p belongs to rank q) and
  // raises counter 0; reduces its own part straight from its private input and the other
  // ranks' slots into its output, publishes that result in its slot and raises counter 1; copies
  // the other ranks' results out and raises counter 2. A rank's own part is thus never copied
  // in, and each byte is read from private memory once and written there once. A slot is
  // refilled only after every rank raised counter 2 for its previous chunk, so up to `slots`
  // chunks are in flight and the copies of one chunk overlap the reduction of another.
  void wait_counter(const SharedSegments& w, int q, int kind, int s, std::uint64_t target) {
    const auto& f = w.flag(q, kind, s);
    if (f.load(std::memory_order_acquire) >= target) return;
    const double start = now_seconds();
    for (unsigned i = 1;; ++i) {
      if (f.load(std::memory_order_acquire) >= target) return;
      if ((i & 63u) == 0) {
        if (deadline_.expired())
          raise<TimeoutError>(operation_label(fp_), concat("wait for rank ", q, " timed out after ",
                                                           deadline_.budget(), " s"));
        // Spin for a couple of microseconds (a partner running on another core answers within
        // that), then yield between polls: when the partner shares this core (more ranks than
        // free cores, a busy machine) every hand-off needs the core given away, and a yield with
        // nothing else runnable returns at once. After 2 ms, sleep between polls.
        const double waited = now_seconds() - start;
        if (waited > 2e-3)
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        else if (waited > 2e-6)
          std::this_thread::yield();
      }
    }
  }

  void run_shm(const uchar* in, uchar* out) {
    SharedSegments& w = *seg_;
    const std::size_t n = s_.count;
    const int p = p_, r = r_, S = w.slots;
    const std::size_t chunk = w.slot_bytes / es_;
    const std::size_t nchunks = ceil_div(n, chunk);
    const bool avg = s_.op == ReduceOp::avg;
    for (std::size_t k = 0; k < nchunks; ++k) {
      const std::uint64_t g = w.next_chunk + k;
      const int slot = static_cast<int>(g % static_cast<std::uint64_t>(S));
      const std::size_t c0 = k * chunk, cl = std::min(chunk, n - c0);
      const std::size_t b0 = block_begin(cl, p, r), b1 = block_begin(cl, p, r + 1);
      uchar* my_slot = w.slot(r, slot);
      if (g >= static_cast<std::uint64_t>(S))
        for (int q = 0; q < p; ++q) wait_counter(w, q, 2, slot, g - S + 1);
      // Everything but this rank's own part, which it reduces from `in` directly.
      if (b0) std::memcpy(my_slot, in + c0 * es_, b0 * es_);
      if (cl > b1) std::memcpy(my_slot + b1 * es_, in + (c0 + b1) * es_, (cl - b1) * es_);
      w.flag(r, 0, slot).store(g + 1, std::memory_order_release);
      const std::size_t bl = b1 - b0;
      uchar* dst = out + (c0 + b0) * es_;
      const uchar* first = in + (c0 + b0) * es_;
      for (int i = 1; i < p; ++i) {
        const int q = (r + i) % p;
        wait_counter(w, q, 0, slot, g + 1);
        if (bl)
          reduce_into(dst, i == 1 ? first : dst, w.slot(q, slot) + b0 * es_, bl, wdtype_, s_.op);
      }
      if (avg && bl) finalize_avg(dst, bl, wdtype_, p);
      if (bl) std::memcpy(my_slot + b0 * es_, dst, bl * es_);
      w.flag(r, 1, slot).store(g + 1, std::memory_order_release);
      for (int i = 1; i < p; ++i) {
        const int q = (r + i) % p;
        wait_counter(w, q, 1, slot, g + 1);
        const std::size_t q0 = block_begin(cl, p, q), ql = block_begin(cl, p, q + 1) - q0;
        if (ql) std::memcpy(out + (c0 + q0) * es_, w.slot(q, slot) + q0 * es_, ql * es_);
      }
      w.flag(r, 2, slot).store(g + 1, std::memory_order_release);
    }
    w.next_chunk += nchunks;
  }

  // ---- broadcast: pipelined binomial tree ------------------------------------------------------
  void run_broadcast(uchar* buf) {
    const std::size_t n = s_.count;
    if (n == 0) return;
    const int p = p_;
    const int v = mod_p(r_ - s_.root);
    int parent = -1, lowbit = p;  // the root may send along every bit
    for (int m = 1; m < p; m <<= 1)
      if (v & m) {
        parent = mod_p(v - m + s_.root);
        lowbit = m;
        break;
      }
    int kids[32];
    int nk = 0;
    for (int m = 1; m < lowbit && v + m < p; m <<= 1) kids[nk++] = mod_p(v + m + s_.root);
    // Send to the child with the largest subtree first.
    std::reverse(kids, kids + nk);
    Request* rq = &reqs_[2];
    Request* sq = rq + nseg_;
    auto seg = [&](std::size_t c, std::size_t& off, std::size_t& len) {
      off = block_begin(n, nseg_, c);
      len = block_begin(n, nseg_, c + 1) - off;
    };
    if (parent >= 0)
      for (std::size_t c = 0; c < nseg_; ++c) {
        std::size_t off, len;
        seg(c, off, len);
        if (len) irecv(rq[c], parent, 1, buf + off * es_, len * es_);
      }
    for (std::size_t c = 0; c < nseg_; ++c) {
      std::size_t off, len;
      seg(c, off, len);
      if (parent >= 0) wait_req(rq[c], parent);
      for (int k = 0; k < nk; ++k)
        if (len) isend(sq[k * nseg_ + c], kids[k], 1, buf + off * es_, len * es_);
    }
    for (int k = 0; k < nk; ++k)
      for (std::size_t c = 0; c < nseg_; ++c) wait_req(sq[k * nseg_ + c], kids[k]);
  }

  CommState<Transport>* comm_;
  Spec s_;
  int p_ = 1, r_ = 0;
  bool widen_ = false;
  DType wdtype_ = DType::f32;
  std::size_t es_ = 4;
  std::size_t seg_elems_ = 1;
  std::size_t nseg_ = 0;
  std::size_t nreq_ = 0;
  std::unique_ptr<Request[]> reqs_;
  std::vector<uchar> wide_in_, scratch_, tmp_;
  std::vector<MemoryRegion> regions_;
  CheckState check_mine_{}, check_peer_{};
  std::uint64_t seq_ = 0;
  Fingerprint fp_{};
  Deadline deadline_{-1};
  int tag_ = 0;
  // ring
  std::size_t max_block_ = 0, ring_base_ = 0;
  // tree
  TreeLinks links_[2];
  std::size_t half_ = 0, tree_base_ = 0, tree_per_ = 0, tree_lag_ = 2, tree_slot_elems_ = 1;
  std::vector<char> down_posted_;
  // shm
  SharedSegments* seg_ = nullptr;
  // rhd
  std::size_t rhd_base_ = 0, rhd_slots_ = 1;
  std::size_t rhd_lo_[64] = {}, rhd_hi_[64] = {};
};

}  // namespace dtrain::detail
