// SPDX-License-Identifier: BSD-3-Clause
// dtrain: all-reduce(avg) of device buckets among the ranks of a node through device IPC (CUDA/
// HIP IPC handles, <dtrain/exec/exec_ipc.hpp>), node by node in rank order between nodes.
//
// Set up once per GradientSync: every rank allocates one device window as large as its arena,
// exports it, and the ranks of a node exchange the handles over the transport and open each
// other's windows; the mappings are reused every step and closed when the sync dies. A step, per
// bucket:
//   1. copy in: the bucket to this rank's window (a device copy on the IPC stream); once it has
//      completed, an "in" flag (8 bytes over the transport) to every rank of the node.
//   2. reduce: the bucket is cut into Lmax parts (Lmax = ranks on the largest node); local rank l
//      of a node of L ranks owns parts [Lmax·l/L, Lmax·(l+1)/L) (the split of partition_begin),
//      as in the hierarchical all-reduce, so uneven nodes line up. Once every rank of the node
//      has flagged its copy, the owner of a part adds the node's windows' copies of it into its
//      own gradients in rank order with the policy's reduce_into: on the first node starting
//      from rank 0's copy, on a later node from the running sum the owner of the part on the
//      node before sent (over the transport). The owner on the last node holds the sum over all
//      ranks in rank order, divides it by p (scale_avg) and sends the average back to the part's
//      owners on the other nodes. These are the bits of the ordered all-reduce and of the host
//      reference, ((x0 + x1) + x2) ... / p, because the nodes are consecutive blocks of ranks
//      (device IPC is not chosen otherwise, see choose_device_ipc).
//   3. publish: the owner copies the average into its window and flags "averages" to the node.
//   4. copy out: every rank copies the others' averages from their windows into its gradients,
//      then flags "read" to them; a bucket completes when every rank of the node has read this
//      rank's window, so the next step's copy in never overwrites what a peer still reads.
// The host only polls events and messages (never dereferences device memory) and blocks only in
// finish, bounded by the communicator's timeout (messages) and exec_timeout_s() (device work).
// Between nodes the running sums and averages are device buffers handed to the transport where
// it takes them (GPU-aware MPI), else staged through pinned host buffers (a copy queued with the
// reduction, the message posted once it is done); GradientSync chooses and logs which.
// Every rank of a node reads each other rank's window once per step over the node's links
// (NVLink, PCIe, or the same device) and writes only its own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/device_allreduce.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_capabilities.hpp>
#include <dtrain/core/env.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/exec/exec_ipc.hpp>
#include <dtrain/exec/exec_traits.hpp>

namespace dtrain {
namespace detail {

/// Tags of device IPC's messages: below the hand-over's 32765 and 32766 (see device_allreduce.hpp).
inline constexpr int kIpcSetupTag = 32760;
inline constexpr int kIpcInTag = 32761;
inline constexpr int kIpcAveragesTag = 32762;
inline constexpr int kIpcReadTag = 32763;
inline constexpr int kIpcChainTag = 32764;  // running sums forward, averages back

/// Whether GradientSync reduces device buckets through device IPC, why (for the log and errors),
/// and whether the messages between nodes take the device buffers as they are (else staged).
struct DeviceIpcChoice {
  bool use = false;
  bool direct = false;
  std::string why;
};

/// Whether device IPC reduces buffers of `dtype`: the accumulator types, added in place (16-bit
/// floats would need an f32 accumulator, the contract's one rounding; they are staged).
inline bool device_ipc_reduces(DType dtype) noexcept {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64;
}

/// Whether every node of `nodes` is a block of consecutive ranks (node order is then rank order).
inline bool nodes_are_rank_blocks(const NodeMap& nodes) {
  for (int m = 0; m < nodes.nodes(); ++m) {
    const std::vector<int>& r = nodes.members(m);
    if (r.back() - r.front() + 1 != static_cast<int>(r.size())) return false;
  }
  return true;
}

/// The rule, a pure function. Device IPC is used when DTRAIN_DEVICE_IPC (`env_value`: auto, 0 or
/// 1; unset: auto) is not 0, there are several ranks, the policy can share its memory
/// (`policy_ipc`), the gradients are of a type the device reduction takes, some node has two
/// ranks or more, and the nodes are consecutive blocks of ranks (so that node by node is rank
/// order). With 1, a reason against it is an InvalidArgument naming the variable instead.
/// `between_nodes`: the transport's answer about device buffers (used when there are several
/// nodes). Throws InvalidArgument for another value of the variable.
inline DeviceIpcChoice choose_device_ipc(bool policy_ipc, DType dtype, const NodeMap& nodes,
                                         const DeviceBuffers& between_nodes,
                                         const std::optional<std::string>& env_value) {
  const int forced =
      env_value ? env::parse_choice("DTRAIN_DEVICE_IPC", *env_value, {"auto", "0", "1"}) : 0;
  const std::string setting =
      env_value ? "DTRAIN_DEVICE_IPC=" + *env_value : std::string("DTRAIN_DEVICE_IPC unset: auto");
  if (forced == 1) return {false, false, "device IPC off (DTRAIN_DEVICE_IPC=0)"};
  if (nodes.size() < 2) return {false, false, "device IPC not needed (one rank)"};
  std::string no;
  if (!policy_ipc)
    no = "the execution policy cannot share its device memory with other processes";
  else if (!device_ipc_reduces(dtype))
    no = std::string(name_of(dtype)) + " gradients (the device reduction takes f32, f64, i32, i64)";
  else if (nodes.shape().max_ranks_per_node < 2)
    no = "no two ranks share a node (nodes " + nodes.describe() + ")";
  else if (!nodes_are_rank_blocks(nodes))
    no = "the nodes are not blocks of consecutive ranks (nodes " + nodes.describe() +
         "), so node by node would not be rank order";
  if (!no.empty()) {
    if (forced == 2) raise<InvalidArgument>("GradientSync", "DTRAIN_DEVICE_IPC=1, but " + no);
    return {false, false, "device IPC not used: " + no};
  }
  DeviceIpcChoice c;
  c.use = true;
  c.direct = between_nodes.handed_over;
  c.why = "averaged on the device through IPC among the ranks of each node (nodes " +
          nodes.describe() + ", " + setting + "; handles exchanged and opened once)";
  if (nodes.nodes() > 1)
    c.why += between_nodes.handed_over
                 ? "; between nodes handed to the transport (" + between_nodes.why + ")"
                 : "; between nodes staged through host memory (" + between_nodes.why + ")";
  return c;
}

/// Whether policy `exec` can share its device memory now (false without the IPC members).
template <class Exec>
bool exec_ipc_available(const Exec& exec) {
  if constexpr (has_exec_ipc_v<Exec>)
    return exec.ipc_available();
  else
    return false;
}

/// Buckets of device memory of policy Exec (which has the IPC members), all-reduced(avg) among
/// the ranks of Transport through device IPC within nodes (see the top of this file). Built once:
/// the window (as large as the buckets together), the mappings of the node's other windows, the
/// staging buffers between nodes, one request per message. Collective over the node at
/// construction (the handles' exchange, bounded by `timeout_s`); start/progress/finish allocate
/// nothing. Local object of one rank, used by one thread; transport and policy must outlive it.
template <class Transport, class Exec>
class DeviceIpcAllreduce final : public DeviceBucketReducer {
  static_assert(has_exec_ipc_v<Exec>, "device IPC needs a policy with the members of exec_ipc.hpp");
  using Request = typename Transport::Request;
  using Handle = typename Exec::ipc_handle_type;

 public:
  /// `direct`: running sums and averages between nodes go to the transport as device buffers
  /// (else through host memory).
  DeviceIpcAllreduce(Transport& t, Exec& exec, const std::vector<BufferView>& buckets,
                     const NodeMap& nodes, bool direct, double timeout_s)
      : t_(&t),
        exec_(&exec),
        buckets_(buckets),
        nodes_(nodes),
        direct_(direct),
        timeout_s_(timeout_s) {
    rank_ = t.rank();
    size_ = t.size();
    DTRAIN_REQUIRE(nodes_.size() == size_, "GradientSync device IPC",
                   "the node map has " << nodes_.size() << " ranks, the transport " << size_);
    node_ = nodes_.node_of(rank_);
    nnodes_ = nodes_.nodes();
    local_ = nodes_.local_rank(rank_);
    lsize_ = nodes_.node_size(node_);
    lmax_ = nodes_.shape().max_ranks_per_node;
    es_ = buckets_.empty() ? 1 : size_of(buckets_[0].dtype);
    std::size_t total = 0, staged = 0;
    for (const BufferView& v : buckets_) {
      DTRAIN_REQUIRE(
          v.space == Exec::space && device_ipc_reduces(v.dtype) && v.dtype == buckets_[0].dtype,
          "GradientSync device IPC",
          "a bucket of " << name_of(v.dtype) << " in " << name_of(v.space)
                         << " memory (device IPC reduces f32, f64, i32 and i64 "
                         << name_of(Exec::space) << " buckets of one type)");
      win_off_.push_back(total);
      total += v.count;
      stage_off_.push_back(staged);
      staged += 2 * owned(v.count, local_).second;
    }
    if (total)
      window_ = Tensor({static_cast<std::int64_t>(total)}, buckets_[0].dtype, exec.allocator());
    if (nnodes_ > 1 && !direct_ && staged)
      stage_ =
          Tensor({static_cast<std::int64_t>(staged)}, buckets_[0].dtype, exec.host_allocator());
    base_.assign(static_cast<std::size_t>(lsize_), nullptr);
    base_[static_cast<std::size_t>(local_)] = window_.raw();
    stream_ = ExecStream<Exec>(exec);
    const std::size_t nparts =
        static_cast<std::size_t>(part_of(lsize_, local_ + 1) - part_of(lsize_, local_));
    nreq_ = 6 * flags() + nparts * static_cast<std::size_t>(nnodes_ + 2);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      State s;
      s.req.reset(new Request[nreq_ > 0 ? nreq_ : 1]);
      s.active.assign(nreq_, 0);
      s.peer.assign(nreq_, -1);
      s.flags_in.assign(3 * flags(), 0);
      s.in = ExecEvent<Exec>(exec);
      s.red = ExecEvent<Exec>(exec);
      s.pub = ExecEvent<Exec>(exec);
      s.out = ExecEvent<Exec>(exec);
      state_.push_back(std::move(s));
    }
    if (total && lsize_ > 1) setup(total);
  }
  ~DeviceIpcAllreduce() override {
    for (std::size_t b = 0; b < state_.size(); ++b) cancel(b);
    stream_ = ExecStream<Exec>();  // its queued copies read the other windows
    close_all();
  }
  DeviceIpcAllreduce(const DeviceIpcAllreduce&) = delete;
  DeviceIpcAllreduce& operator=(const DeviceIpcAllreduce&) = delete;

  void start(std::size_t b) override {
    State& s = state_[b];
    ++s.stamp;
    s.flag_out = s.stamp * buckets_.size() + b;  // every flag of this bucket and step says so
    const BufferView v = buckets_[b];
    // The host saw the bucket's event complete: the copy needs no stream wait.
    exec_->copy_d2d(stream_.get(), window(local_, b, 0), v.data, v.bytes());
    exec_->record(s.in.get(), stream_.get());
    for (int q = 0; q < lsize_; ++q)
      if (q != local_) post_flag_recv(b, kInRecv, q, kIpcInTag, &s.flags_in[flag_slot(kInRecv, q)]);
    s.phase = kCopyIn;
  }

  bool progress(std::size_t b) override {
    run(b, nullptr);
    // Not before the read flags are sent: every rank then sends each kind of flag in bucket order.
    return state_[b].phase == kIdle || state_[b].phase >= kReadWait;
  }

  void finish(std::size_t b) override {
    const Deadline deadline(timeout_s_);
    run(b, &deadline);
  }

  void cancel(std::size_t b) noexcept override {
    State& s = state_[b];
    for (std::size_t i = 0; i < nreq_; ++i)
      if (s.active[i]) {
        t_->cancel(s.req[i]);
        s.active[i] = 0;
      }
    s.phase = kIdle;
  }

 private:
  enum Phase : unsigned char {
    kIdle,
    kCopyIn,    // copy into the window queued
    kGather,    // "in" flags posted; waiting for the node's (and the running sums from before)
    kReducing,  // reduction queued
    kChain,     // running sums sent on; waiting for the average from the last node
    kPublish,   // average copied into the window
    kAverages,  // "averages" flags sent; waiting for the node's
    kCopyOut,   // the others' averages being copied out
    kReadWait,  // "read" flags sent; waiting for the node's and for the sends
  };
  // Request slots of a bucket: six kinds of node messages, one slot per other rank of the node,
  // then per owned part: running sum out, running sum in, average in, averages out (one per
  // earlier node).
  enum Kind : std::size_t { kInRecv, kInSend, kAvgRecv, kAvgSend, kReadRecv, kReadSend };
  struct State {
    Phase phase = kIdle;
    std::uint64_t stamp = 0;  // steps started
    std::unique_ptr<Request[]> req;
    std::vector<unsigned char> active;
    std::vector<int> peer;
    std::vector<std::uint64_t> flags_in;  // received flags: kind x other rank
    std::uint64_t flag_out = 0;           // this step's flag (the same for every kind)
    ExecEvent<Exec> in, red, pub, out;
  };

  std::size_t flags() const noexcept { return static_cast<std::size_t>(lsize_ - 1); }
  std::size_t slot(int q) const noexcept {
    return static_cast<std::size_t>(q < local_ ? q : q - 1);
  }
  std::size_t index(Kind k, int q) const noexcept { return k * flags() + slot(q); }
  // Where the flag of receive kind k from local rank q lands (in, averages, read).
  std::size_t flag_slot(Kind k, int q) const noexcept { return (k / 2) * flags() + slot(q); }
  std::size_t chain(int part, std::size_t what) const noexcept {
    return 6 * flags() +
           static_cast<std::size_t>(part - part_of(lsize_, local_)) *
               static_cast<std::size_t>(nnodes_ + 2) +
           what;
  }
  // First part of local rank q of a node of L ranks (q == L: the end).
  int part_of(int L, int q) const noexcept {
    return static_cast<int>(partition_begin(static_cast<std::size_t>(lmax_), L, q));
  }
  // First element of part j of a bucket of n elements.
  std::size_t part_begin(std::size_t n, int j) const noexcept {
    return partition_begin(n, lmax_, j);
  }
  // Elements (first, count) of a bucket of n that local rank q of this node owns.
  std::pair<std::size_t, std::size_t> owned(std::size_t n, int q) const noexcept {
    const std::size_t lo = part_begin(n, part_of(lsize_, q));
    return {lo, part_begin(n, part_of(lsize_, q + 1)) - lo};
  }
  // Transport rank of the owner of part j on node m.
  int owner(int m, int j) const {
    const std::vector<int>& r = nodes_.members(m);
    const int L = static_cast<int>(r.size());
    for (int q = 0; q < L; ++q)
      if (j < part_of(L, q + 1)) return r[static_cast<std::size_t>(q)];
    return r.back();
  }
  // Element `e` of bucket b in local rank q's window.
  void* window(int q, std::size_t b, std::size_t e) const {
    return static_cast<char*>(base_[static_cast<std::size_t>(q)]) + (win_off_[b] + e) * es_;
  }
  BufferView window_view(int q, std::size_t b, std::size_t e, std::size_t n) const {
    return BufferView(window(q, b, e), n, buckets_[b].dtype, Exec::space);
  }
  // Element `e` (of the bucket) of bucket b's staging buffers: running sums (0), averages (1).
  void* staging(std::size_t b, int which, std::size_t e) {
    const std::size_t m = owned(buckets_[b].count, local_).second;
    const std::size_t lo = owned(buckets_[b].count, local_).first;
    return static_cast<char*>(stage_.raw()) + (stage_off_[b] + which * m + (e - lo)) * es_;
  }

  void post_recv(std::size_t b, std::size_t i, int peer, int tag, void* data, std::size_t bytes) {
    State& s = state_[b];
    t_->irecv(s.req[i], peer, tag, data, bytes);
    s.active[i] = 1;
    s.peer[i] = peer;
  }
  void post_flag_recv(std::size_t b, Kind k, int q, int tag, std::uint64_t* flag) {
    post_recv(b, index(k, q), member(q), tag, flag, 8);
  }
  void post_send(std::size_t b, std::size_t i, int peer, int tag, const void* data,
                 std::size_t bytes) {
    State& s = state_[b];
    t_->isend(s.req[i], peer, tag, data, bytes);
    s.active[i] = 1;
    s.peer[i] = peer;
  }
  int member(int q) const { return nodes_.members(node_)[static_cast<std::size_t>(q)]; }
  // Sends this step's flag of kind k (a send kind) to every other rank of the node.
  void send_flags(std::size_t b, Kind k, int tag) {
    State& s = state_[b];
    for (int q = 0; q < lsize_; ++q)
      if (q != local_) post_send(b, index(k, q), member(q), tag, &s.flag_out, 8);
  }
  void check_flags(std::size_t b, Kind k, const char* what) {
    State& s = state_[b];
    const std::uint64_t want = s.flag_out;
    for (int q = 0; q < lsize_; ++q) {
      if (q == local_) continue;
      const std::uint64_t got = s.flags_in[flag_slot(k, q)];
      if (got != want)
        raise<InvalidArgument>(
            "GradientSync device IPC",
            concat("bucket ", b, ": rank ", member(q), " is out of step (its ", what,
                   " flag is for bucket ", got % buckets_.size(), " of step ",
                   got / buckets_.size(), ", this rank is at bucket ", b, " of step ", s.stamp,
                   "): every rank must report the same buckets each step"));
    }
  }

  // Whether device work recorded on `event` is done (waits for it with a deadline).
  bool done(typename Exec::event_type event, const Deadline* d) {
    if (!d) return exec_->query(event);
    exec_wait(*exec_, event, exec_timeout_s(), "GradientSync device IPC (device copies)");
    return true;
  }
  // Whether the active requests among [first, first + n) have completed (waits with a deadline).
  bool complete(std::size_t b, std::size_t first, std::size_t n, const Deadline* d,
                const char* what) {
    State& s = state_[b];
    for (std::size_t i = first; i < first + n; ++i) {
      if (!s.active[i]) continue;
      if (!d) {
        if (!t_->test(s.req[i])) return false;
      } else if (!t_->wait_until(s.req[i], *d)) {
        const int peer = s.peer[i];
        cancel(b);
        raise<TimeoutError>(
            "GradientSync device IPC",
            concat("bucket ", b, " (", buckets_[b].bytes(), " B), ", what, ": message with rank ",
                   peer, " timed out after ", timeout_s_, " s"));
      }
      s.active[i] = 0;
    }
    return true;
  }
  bool complete_kind(std::size_t b, Kind k, const Deadline* d, const char* what) {
    return complete(b, k * flags(), flags(), d, what);
  }

  // Moves bucket b on as far as it goes: without blocking (d null), or to its end.
  void run(std::size_t b, const Deadline* d) {
    State& s = state_[b];
    const BufferView v = buckets_[b];
    const std::size_t n = v.count;
    const int jlo = part_of(lsize_, local_), jhi = part_of(lsize_, local_ + 1);
    const bool last = node_ == nnodes_ - 1;
    Exec& e = *exec_;
    auto st = stream_.get();
    for (;;) {
      switch (s.phase) {
        case kIdle: return;
        case kCopyIn:
          if (!done(s.in.get(), d)) return;
          send_flags(b, kInSend, kIpcInTag);
          for (int q = 0; q < lsize_; ++q) {
            if (q == local_) continue;
            post_flag_recv(b, kAvgRecv, q, kIpcAveragesTag, &s.flags_in[flag_slot(kAvgRecv, q)]);
          }
          if (node_ > 0)
            for (int j = jlo; j < jhi; ++j) {
              const std::size_t pb = part_begin(n, j), pc = part_begin(n, j + 1) - pb;
              if (pc)
                post_recv(b, chain(j, 1), owner(node_ - 1, j), kIpcChainTag,
                          direct_ ? static_cast<char*>(v.data) + pb * es_ : staging(b, 0, pb),
                          pc * es_);
            }
          s.phase = kGather;
          break;
        case kGather:
          if (!complete_kind(b, kInRecv, d, "copies of the node flagged")) return;
          for (int j = jlo; j < jhi; ++j)
            if (!complete(b, chain(j, 1), 1, d, "running sum from the node before")) return;
          check_flags(b, kInRecv, "copy");
          for (int j = jlo; j < jhi; ++j) {
            const std::size_t pb = part_begin(n, j), pc = part_begin(n, j + 1) - pb;
            if (!pc) continue;
            const BufferView acc = v.slice(pb, pc);
            int q0 = 0;
            if (node_ == 0) {
              e.copy_d2d(st, acc.data, window(0, b, pb), pc * es_);
              q0 = 1;
            } else if (!direct_) {
              e.copy_h2d(st, acc.data, staging(b, 0, pb), pc * es_);
            }
            for (int q = q0; q < lsize_; ++q)
              e.reduce_into(st, ReduceOp::avg, acc, window_view(q, b, pb, pc));
            if (last) {
              e.scale_avg(st, acc, size_);
              e.copy_d2d(st, window(local_, b, pb), acc.data, pc * es_);
              if (nnodes_ > 1 && !direct_) e.copy_d2h(st, staging(b, 1, pb), acc.data, pc * es_);
            } else if (!direct_) {
              e.copy_d2h(st, staging(b, 0, pb), acc.data, pc * es_);
            }
          }
          e.record(s.red.get(), st);
          s.phase = kReducing;
          break;
        case kReducing:
          if (!done(s.red.get(), d)) return;
          for (int j = jlo; j < jhi; ++j) {
            const std::size_t pb = part_begin(n, j), pc = part_begin(n, j + 1) - pb;
            if (!pc) continue;
            if (last) {
              // The average to the part's owners on the other nodes.
              for (int m = 0; m + 1 < nnodes_; ++m)
                post_send(b, chain(j, 3 + static_cast<std::size_t>(m)), owner(m, j), kIpcChainTag,
                          direct_ ? window(local_, b, pb) : staging(b, 1, pb), pc * es_);
            } else {
              post_send(b, chain(j, 0), owner(node_ + 1, j), kIpcChainTag,
                        direct_ ? static_cast<char*>(v.data) + pb * es_ : staging(b, 0, pb),
                        pc * es_);
              post_recv(b, chain(j, 2), owner(nnodes_ - 1, j), kIpcChainTag,
                        direct_ ? window(local_, b, pb) : staging(b, 1, pb), pc * es_);
            }
          }
          if (last) {
            send_flags(b, kAvgSend, kIpcAveragesTag);
            s.phase = kAverages;
          } else {
            s.phase = kChain;
          }
          break;
        case kChain: {
          for (int j = jlo; j < jhi; ++j)
            if (!complete(b, chain(j, 0), 3, d, "average from the last node")) return;
          const auto own = owned(n, local_);
          if (!direct_)
            for (int j = jlo; j < jhi; ++j) {
              const std::size_t pb = part_begin(n, j), pc = part_begin(n, j + 1) - pb;
              if (pc) e.copy_h2d(st, window(local_, b, pb), staging(b, 1, pb), pc * es_);
            }
          if (own.second)
            e.copy_d2d(st, static_cast<char*>(v.data) + own.first * es_,
                       window(local_, b, own.first), own.second * es_);
          e.record(s.pub.get(), st);
          s.phase = kPublish;
          break;
        }
        case kPublish:
          if (!done(s.pub.get(), d)) return;
          send_flags(b, kAvgSend, kIpcAveragesTag);
          s.phase = kAverages;
          break;
        case kAverages:
          if (!complete_kind(b, kAvgRecv, d, "averages of the node flagged")) return;
          check_flags(b, kAvgRecv, "averages");
          for (int q = 0; q < lsize_; ++q) {
            if (q == local_) continue;
            const auto r = owned(n, q);
            if (r.second)
              e.copy_d2d(st, static_cast<char*>(v.data) + r.first * es_, window(q, b, r.first),
                         r.second * es_);
          }
          e.record(s.out.get(), st);
          s.phase = kCopyOut;
          break;
        case kCopyOut:
          if (!done(s.out.get(), d)) return;
          for (int q = 0; q < lsize_; ++q)
            if (q != local_)
              post_flag_recv(b, kReadRecv, q, kIpcReadTag, &s.flags_in[flag_slot(kReadRecv, q)]);
          send_flags(b, kReadSend, kIpcReadTag);
          s.phase = kReadWait;
          break;
        case kReadWait:
          if (!complete(b, 0, nreq_, d, "windows read by the node")) return;
          check_flags(b, kReadRecv, "read");
          s.phase = kIdle;
          return;
      }
    }
  }

  // Exchanges `bytes` from `mine` with every other rank of the node (theirs: one per slot).
  void exchange(Request* req, const void* mine, void* theirs, std::size_t bytes, const char* what) {
    const std::size_t F = flags();
    std::vector<unsigned char> active(2 * F, 0);
    for (int q = 0; q < lsize_; ++q) {
      if (q == local_) continue;
      t_->irecv(req[slot(q)], member(q), kIpcSetupTag, static_cast<char*>(theirs) + slot(q) * bytes,
                bytes);
      active[slot(q)] = 1;
      t_->isend(req[F + slot(q)], member(q), kIpcSetupTag, mine, bytes);
      active[F + slot(q)] = 1;
    }
    const Deadline deadline(timeout_s_);
    for (std::size_t i = 0; i < 2 * F; ++i) {
      if (!t_->wait_until(req[i], deadline)) {
        for (std::size_t k = 0; k < 2 * F; ++k)
          if (active[k] && k != i) t_->cancel(req[k]);
        t_->cancel(req[i]);
        const std::size_t k = i % F;
        const int peer =
            member(static_cast<int>(k) < local_ ? static_cast<int>(k) : static_cast<int>(k) + 1);
        raise<TimeoutError>(
            "GradientSync device IPC",
            concat("setup (", what, "): message with rank ", peer, " timed out after ", timeout_s_,
                   " s (every rank of the node builds the sync at the same time)"));
      }
      active[i] = 0;
    }
  }

  // Exchanges the window handles with the node and opens the others' windows; then every rank
  // tells the node whether it succeeded, so that all fail together instead of some waiting.
  void setup(std::size_t total) {
    struct Hello {
      std::uint64_t layout;
      std::uint64_t elements;
      Handle handle;
    };
    std::uint64_t layout = 1469598103934665603ull;  // FNV-1a over the bucket sizes and type
    auto mix = [&](std::uint64_t x) {
      for (int i = 0; i < 8; ++i) layout = (layout ^ ((x >> (8 * i)) & 0xff)) * 1099511628211ull;
    };
    mix(static_cast<std::uint64_t>(buckets_[0].dtype));
    for (const BufferView& v : buckets_) mix(v.count);
    const Hello mine{layout, total, exec_->ipc_export(window_.raw())};
    const std::size_t F = flags();
    std::unique_ptr<Request[]> req(new Request[2 * F]);
    std::vector<Hello> theirs(F);
    exchange(req.get(), &mine, theirs.data(), sizeof(Hello), "window handles");
    std::string err;
    bool device_err = false;
    for (int q = 0; q < lsize_ && err.empty(); ++q) {
      if (q == local_) continue;
      const Hello& h = theirs[slot(q)];
      if (h.layout != layout || h.elements != total)
        err = concat("rank ", member(q), " has another gradient layout (", h.elements,
                     " elements in its buckets, this rank ", total,
                     "): every rank must build the sync alike");
    }
    for (int q = 0; q < lsize_ && err.empty(); ++q) {
      if (q == local_) continue;
      try {
        void* p = exec_->ipc_open(theirs[slot(q)].handle);
        opened_.push_back(p);
        base_[static_cast<std::size_t>(q)] = p;
      } catch (const std::exception& x) {
        err = concat("opening rank ", member(q), "'s window: ", x.what());
        device_err = true;
      }
    }
    const unsigned char ok = err.empty() ? 1 : 0;
    std::vector<unsigned char> oks(F);
    try {
      exchange(req.get(), &ok, oks.data(), 1, "status");
    } catch (...) {
      close_all();
      throw;
    }
    if (!err.empty()) {
      close_all();
      if (device_err)
        raise<DeviceError>("GradientSync device IPC",
                           err + " (DTRAIN_DEVICE_IPC=0 turns device IPC off)");
      raise<InvalidArgument>("GradientSync device IPC", err);
    }
    for (int q = 0; q < lsize_; ++q)
      if (q != local_ && !oks[slot(q)]) {
        close_all();
        raise<RemoteError>(
            "GradientSync device IPC",
            concat("rank ", member(q),
                   " of this node could not set up device IPC (its error says why)"));
      }
  }

  void close_all() noexcept {
    for (void* p : opened_) exec_->ipc_close(p);
    opened_.clear();
  }

  Transport* t_;
  Exec* exec_;
  std::vector<BufferView> buckets_;
  NodeMap nodes_;
  bool direct_;
  double timeout_s_;
  int rank_ = 0, size_ = 1, node_ = 0, nnodes_ = 1, local_ = 0, lsize_ = 1, lmax_ = 1;
  std::size_t es_ = 1, nreq_ = 0;
  std::vector<std::size_t> win_off_, stage_off_;  // per bucket, in elements
  Tensor window_, stage_;
  std::vector<void*> base_;    // every window of the node, this rank's own included
  std::vector<void*> opened_;  // the others' windows, mapped here
  std::vector<State> state_;
  ExecStream<Exec> stream_;
};

/// The device IPC reducer where Exec has the IPC members (null otherwise: never chosen then).
template <class Transport, class Exec>
std::unique_ptr<DeviceBucketReducer> make_device_ipc(Transport& t, Exec& exec,
                                                     const std::vector<BufferView>& buckets,
                                                     bool direct, double timeout_s) {
  if constexpr (has_exec_ipc_v<Exec>)
    return std::make_unique<DeviceIpcAllreduce<Transport, Exec>>(t, exec, buckets, node_map_of(t),
                                                                 direct, timeout_s);
  else
    return nullptr;
}

/// GradientSync's choice for device gradients of `dtype` from policy `exec` over transport `t`
/// (choose_device_ipc with the policy's answer, the transport's node map, `between_nodes` and
/// DTRAIN_DEVICE_IPC). Local; InvalidArgument as choose_device_ipc.
template <class Transport, class Exec>
DeviceIpcChoice device_ipc_choice(Transport& t, const Exec& exec, DType dtype,
                                  const DeviceBuffers& between_nodes) {
  return choose_device_ipc(exec_ipc_available(exec), dtype, node_map_of(t), between_nodes,
                           env::get("DTRAIN_DEVICE_IPC"));
}

}  // namespace detail
}  // namespace dtrain
