// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what every collective algorithm of a plan works with: the plan's description, its
// channels (every message it will ever send or receive, fixed at construction), its scratch
// memory and the reduction of the widened element type.
//
// An algorithm (one header each in this folder) builds its schedule in its constructor: it asks
// for scratch buffers and declares one channel per message with add_send / add_recv, naming the
// peer, a channel id and the (buffer, bytes) the message uses on every execution. run() then only
// starts and waits channels by the index add_* returned, and reduces. Channel ids are agreed
// between the two ends without communication: both sides compute the same id for one message
// from the algorithm's schedule (step, segment...), never from a sequence number, so a plan
// replays exactly the same (peer, id, address, bytes) pattern on every execution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/detail/fingerprint.hpp>
#include <dtrain/comm/detail/futex_wait.hpp>
#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/kernels/host/reduce.hpp>

namespace dtrain::detail {

/// What a plan computes: fixed at construction.
struct PlanSpec {
  CollectiveKind kind = CollectiveKind::barrier;
  AllreduceAlgorithm algo = AllreduceAlgorithm::ring;
  ReduceOp op = ReduceOp::sum;
  DType dtype = DType::f32;
  std::size_t count = 0;  // elements of the full vector (allreduce, broadcast, reduce_scatter
                          // input, allgather output)
  const void* in = nullptr;
  void* out = nullptr;
  int root = 0;
  Space space = Space::host;  // of the caller's buffers (device only where the transport can)
  // Exchange call fingerprints before each execution (when the communicator checks at all);
  // off for the later plans of a group that always runs together in a fixed order.
  bool check = true;
  // An all-reduce that `automatic` chose: the runner-up it checks itself against while in use
  // (detail/adaptive.hpp); `automatic` = no check, the plan keeps `algo`.
  AllreduceAlgorithm runner_up = AllreduceAlgorithm::automatic;
  // What the plan serves where it is not one of the caller's collectives (the cost-model
  // calibration's measurements): its errors name it after the operation, so that a timeout there
  // does not read as the caller's collective of the same sequence number. Static text; null for
  // the caller's plans.
  const char* during = nullptr;
};

/// The operation's name in errors: operation_label(f), and what the plan serves where `spec`
/// says (PlanSpec::during).
inline std::string plan_label(const Fingerprint& f, const PlanSpec& spec) {
  std::string s = operation_label(f);
  if (spec.during) s += concat(" during ", spec.during);
  return s;
}

/// Elements [begin, end) of block `i` when `count` elements are split into `parts` blocks whose
/// sizes differ by at most one (the first count % parts blocks are one larger).
inline std::size_t block_begin(std::size_t count, std::size_t parts, std::size_t i) noexcept {
  const std::size_t q = count / parts, r = count % parts;
  return i * q + (i < r ? i : r);
}
inline std::size_t ceil_div(std::size_t a, std::size_t b) noexcept {
  return a == 0 ? 0 : (a + b - 1) / b;
}

/// Channel ids below this are the fingerprint exchange's (one per dissemination round, the same
/// in every plan so that mismatched calls still meet); algorithms number theirs from here. The
/// two-sided fallback sends each message with tag channel_tag(id) (transport_channels.hpp).
inline constexpr int kFirstAlgorithmChannel = 32;
/// The plan-wide state the algorithms share. Lives inside its plan (never moves).
template <class Transport>
class PlanContext {
 public:
  using Request = typename Transport::Request;
  using uchar = unsigned char;

  PlanContext(CommState<Transport>& comm, const PlanSpec& s)
      : comm_(&comm),
        spec_(s),
        size_(comm.transport->size()),
        rank_(comm.transport->rank()),
        caps_(capabilities_of(*comm.transport)),
        use_channels_(comm.config.persistent_channels && channels_available(*comm.transport)),
        segments_(shared_segments_of(*comm.transport)) {
    const bool widen =
        (s.dtype == DType::f16 || s.dtype == DType::bf16) &&
        (s.kind == CollectiveKind::allreduce || s.kind == CollectiveKind::reduce_scatter);
    wdtype_ = widen ? DType::f32 : s.dtype;
    elem_bytes_ = size_of(wdtype_);
    const std::size_t seg_bytes = comm.config.segment_bytes < 64 ? 64 : comm.config.segment_bytes;
    seg_elems_ = seg_bytes / elem_bytes_ ? seg_bytes / elem_bytes_ : 1;
  }
  /// A group view of `parent` for an algorithm run on a subset of the ranks (the hierarchical
  /// all-reduce runs the flat algorithms this way): `members` maps group rank -> transport rank
  /// and holds this rank; the view's vector has `count` elements of the parent's widened type,
  /// reduced with `op`; the algorithm's channel id kFirstAlgorithmChannel + k becomes
  /// `id_offset` + k, and k must stay below `id_span` (ranges given to views sharing a pair of
  /// ranks are disjoint). `segments`: node-shared segments of exactly these ranks, indexed by
  /// group rank, for the shm algorithm on the view (null: none).
  /// Channels, scratch and registrations go to the plan's own context; the view lives inside
  /// the plan's algorithm.
  PlanContext(PlanContext& parent, std::vector<int> members, std::size_t count, ReduceOp op,
              int id_offset, int id_span, SharedSegments* segments = nullptr)
      : comm_(parent.comm_),
        spec_(parent.spec_),
        size_(static_cast<int>(members.size())),
        rank_(-1),
        caps_(parent.caps_),
        use_channels_(parent.use_channels_),
        root_(parent.root_ ? parent.root_ : &parent),
        segments_(segments),
        group_(std::move(members)),
        id_offset_(id_offset),
        id_span_(id_span) {
    for (int g = 0; g < size_; ++g)
      if (group_[static_cast<std::size_t>(g)] == parent.transport().rank()) rank_ = g;
    DTRAIN_ASSERT(rank_ >= 0);
    spec_.count = count;
    spec_.op = op;
    spec_.dtype = parent.wdtype_;
    spec_.in = spec_.out = nullptr;
    wdtype_ = parent.wdtype_;
    elem_bytes_ = parent.elem_bytes_;
    seg_elems_ = parent.seg_elems_;
  }
  ~PlanContext() {
    if (root_) return;  // a view owns nothing
    cancel_all();
    if constexpr (has_channels<Transport>::value)
      for (std::size_t i = 0; i < bound_.size(); ++i)
        if (channels_[i].bytes) comm_->transport->unbind(bound_[i]);
    if (quarantined_) return;  // registrations stay: a late transfer may still use them
    for (auto& r : regions_)
      if (r.registered) comm_->transport->deregister_memory(r.region);
  }
  PlanContext(const PlanContext&) = delete;
  PlanContext& operator=(const PlanContext&) = delete;

  // ---- description ---------------------------------------------------------------------------
  const PlanSpec& spec() const noexcept { return spec_; }
  CommState<Transport>& comm() noexcept { return *comm_; }
  Transport& transport() noexcept { return *comm_->transport; }
  int size() const noexcept { return size_; }
  int rank() const noexcept { return rank_; }
  /// Segments shared by exactly this context's ranks, indexed by its rank: the transport's
  /// whole-group segments for a plan's own context, what the view was given for a group view;
  /// null when there are none.
  SharedSegments* shared_segments() const noexcept { return segments_; }
  /// Element type the algorithms move and reduce (f32 for 16-bit floats, which are widened once).
  DType wdtype() const noexcept { return wdtype_; }
  bool widened() const noexcept { return wdtype_ != spec_.dtype; }
  std::size_t elem_bytes() const noexcept { return elem_bytes_; }
  /// Elements per pipelining segment.
  std::size_t segment_elems() const noexcept { return seg_elems_; }
  int mod_p(long x) const noexcept {
    const long p = size_;
    return static_cast<int>(((x % p) + p) % p);
  }

  // ---- scratch memory ------------------------------------------------------------------------
  /// A host buffer of `bytes` for the plan's executions (registered like the caller's buffers).
  /// Its content at the start of an execution is unspecified: on transports without memory
  /// registration it lies in the communicator's ScratchPool, shared with the other plans (which
  /// never run at the same time); elsewhere it is the plan's own, zeroed. Distinct calls of one
  /// plan never overlap.
  uchar* scratch(std::size_t bytes) {
    if (root_) return root_->scratch(bytes);
    uchar* p = nullptr;
    if (!caps_.requires_registration && !caps_.one_sided) {
      const std::size_t at = (pool_used_ + 63) / 64 * 64;
      ScratchPool::Block b = comm_->scratch_pool.acquire(at + bytes);
      // A new, larger block holds none of this plan's earlier pieces, so any offset would do;
      // keeping `at` keeps the rule simple: pieces of one plan are disjoint in every block.
      if (pool_blocks_.empty() || pool_blocks_.back() != b) pool_blocks_.push_back(b);
      p = b->data() + at;
      pool_used_ = at + bytes;
    } else {
      buffers_.emplace_back(bytes);
      p = buffers_.back().data();
    }
    register_range(p, bytes, Space::host);
    return p;
  }
  /// Declares memory the plan sends from or receives into (nothing for null or empty ranges).
  /// A transport that requires registration (or is one-sided, where registration made once per
  /// plan saves registering in the hot loop) gets it registered now, and every message in it
  /// then uses the region register_memory returned.
  void register_range(const void* p, std::size_t bytes, Space space) {
    if (root_) return root_->register_range(p, bytes, space);
    if (!p || !bytes) return;
    Range r;
    r.base = static_cast<const uchar*>(p);
    r.bytes = bytes;
    if (caps_.requires_registration || caps_.one_sided) {
      r.region = comm_->transport->register_memory(const_cast<void*>(p), bytes, space);
      r.registered = true;
    } else {
      r.region = MemoryRegion{const_cast<void*>(p), bytes, space, 0, nullptr};
    }
    regions_.push_back(r);
  }
  const TransportCapabilities& capabilities() const noexcept { return caps_; }
  /// Whether this plan's channels are the transport's persistent ones (else isend / irecv).
  bool persistent() const noexcept { return use_channels_; }

  // ---- channels ------------------------------------------------------------------------------
  /// Declares a message to `peer` (plan construction). Returns the channel's index for run().
  std::size_t add_send(int peer, int id, const void* data, std::size_t bytes) {
    return add(peer, id, true, const_cast<void*>(data), bytes);
  }
  /// Declares a message from `peer` into `data`.
  std::size_t add_recv(int peer, int id, void* data, std::size_t bytes) {
    return add(peer, id, false, data, bytes);
  }
  /// Ends the schedule (once, by the plan): locates every message in its region, allocates each
  /// channel's request and, with persistent channels, binds them all with the transport.
  void bind_channels() {
    DTRAIN_ASSERT(!root_);
    requests_.reset(new Request[channels_.size()]);
    for (Channel& c : channels_) {
      if (!c.bytes) continue;
      const Range& r = range_of(c);
      c.data = static_cast<uchar*>(r.region.data) + c.offset;
    }
    if constexpr (has_channels<Transport>::value) {
      if (!use_channels_) return;
      Transport& t = *comm_->transport;
      bound_.resize(channels_.size());
      for (std::size_t i = 0; i < channels_.size(); ++i) {
        const Channel& c = channels_[i];
        if (!c.bytes) continue;
        const MemoryRegion& m = regions_[c.range].region;
        bound_[i] = c.send ? t.bind_send(c.peer, c.id, m, c.offset, c.bytes)
                           : t.bind_recv(c.peer, c.id, m, c.offset, c.bytes);
      }
    }
  }
  /// Posts channel `i` (an empty message is no message: start and wait do nothing).
  void start(std::size_t i) {
    if (root_) return root_->start(i);
    const Channel& c = channels_[i];
    if (!c.bytes) return;
    Transport& t = *comm_->transport;
    if constexpr (has_channels<Transport>::value) {
      if (use_channels_) {
        t.start(requests_[i], bound_[i]);
        return;
      }
    }
    if (c.send)
      t.isend(requests_[i], c.peer, channel_tag(c.id), c.data, c.bytes);
    else
      t.irecv(requests_[i], c.peer, channel_tag(c.id), c.data, c.bytes);
  }
  /// Blocks until channel `i` completed; TimeoutError naming the peer at the deadline.
  void wait(std::size_t i) {
    if (root_) return root_->wait(i);
    const Channel& c = channels_[i];
    if (!c.bytes) return;
    if (!comm_->transport->wait_until(requests_[i], deadline_)) timeout(c.peer);
  }
  /// Abandons every channel (error paths). Returns how many transfers the transport had to
  /// release while still active (MpiTransport::abandoned): MPI may still read or write their
  /// memory, so the plan's own memory (scratch) is then quarantined for the rest of the process
  /// (moved to a list that is never freed, its registrations kept) instead of going back to the
  /// heap where a late peer's data would land in reused memory. Never throws.
  std::size_t cancel_all() noexcept {
    if (root_) return root_->cancel_all();
    if (!requests_) return 0;
    Transport& t = *comm_->transport;
    const std::size_t before = abandoned_transfers(t);
    for (std::size_t i = 0; i < channels_.size(); ++i) t.cancel(requests_[i]);
    const std::size_t stuck = abandoned_transfers(t) - before;
    if (stuck) {
      quarantine();
      note_unfinished_operations(stuck);
    }
    return stuck;
  }
  std::size_t channel_count() const noexcept {
    return root_ ? root_->channel_count() : channels_.size();
  }

  // ---- one execution -------------------------------------------------------------------------
  void begin(std::uint64_t seq) {
    fingerprint_ = make_fingerprint(spec_.kind, seq, spec_.count, spec_.dtype, spec_.op, spec_.algo,
                                    spec_.root);
    // Polled: the waits of a collective check it often, so a long gap between two checks means
    // this rank was descheduled (the timeout says so); it ends at once when the communicator is
    // abandoned (a failed collective, a handle dropped while an error unwinds the stack).
    deadline_ = Deadline::polled(comm_->config.timeout_s, &comm_->engine.abandon_flag());
  }
  const Fingerprint& fingerprint() const noexcept {
    return root_ ? root_->fingerprint_ : fingerprint_;
  }
  const Deadline& deadline() const noexcept { return root_ ? root_->deadline_ : deadline_; }
  /// The error for a wait on transport rank `peer` that ended unsuccessfully: RemoteError when
  /// the communicator was abandoned (the wait was cut short on purpose), else TimeoutError
  /// naming the peer, what is known of its process, and this rank's own descheduling
  /// (detail/peer_liveness.hpp).
  [[noreturn]] void timeout(int peer) const {
    if (root_) root_->timeout(peer);
    if (deadline_.abandoned())
      raise<RemoteError>(plan_label(fingerprint_, spec_),
                         concat("wait for rank ", peer,
                                " abandoned: an earlier collective of this communicator failed "
                                "or an error is unwinding this rank"));
    raise<TimeoutError>(plan_label(fingerprint_, spec_),
                        timeout_detail(*comm_->transport, peer, deadline_));
  }
  /// What the plan's waits on node-shared counters call to keep the transport's own transfers
  /// moving (transport_progress): a counter wait that did not would deadlock with a peer whose
  /// send of the previous collective waits for this rank's progress.
  WaitProgress wait_progress() const noexcept {
    if constexpr (has_transport_progress<Transport>::value)
      return WaitProgress{&poke_transport, comm_->transport};
    else
      return WaitProgress{};
  }
  /// The transport rank of this context's rank `g` (the identity outside a group view).
  int transport_rank(int g) const noexcept {
    return root_ && g >= 0 ? group_[static_cast<std::size_t>(g)] : g;
  }

  // ---- reduction: the one contract of <dtrain/kernels/host/reduce.hpp> -----------------------
  /// dst = a op b over n elements of the widened type; dst may alias a or b.
  void reduce(void* dst, const void* a, const void* b, std::size_t n) const {
    host::reduce(spec_.op, wdtype_, dst, a, b, n);
  }
  /// Finishes an avg on n reduced elements (divides by the number of ranks).
  void finish_avg(void* data, std::size_t n) const {
    if (spec_.op == ReduceOp::avg) host::scale_avg(wdtype_, data, n, size_);
  }
  /// out0 = out1 = a op b, finished as finish_avg does, in one pass: the bits of reduce,
  /// finish_avg and a copy. out0 may alias a and out1 b (or the reverse).
  void reduce_finish_twice(void* out0, void* out1, const void* a, const void* b,
                           std::size_t n) const {
    host::reduce_store2(spec_.op, wdtype_, a, b, out0, out1, n, size_);
  }

 private:
  struct Channel {
    int peer = -1;
    int id = 0;
    bool send = false;
    void* data = nullptr;  // the message's address in its region
    std::size_t bytes = 0;
    std::size_t range = 0;   // index into regions_
    std::size_t offset = 0;  // within that region
    const void* raw = nullptr;
  };
  struct Range {
    const uchar* base = nullptr;
    std::size_t bytes = 0;
    MemoryRegion region;
    bool registered = false;
  };

  template <class T, class = void>
  struct counts_abandoned : std::false_type {};
  template <class T>
  struct counts_abandoned<T, std::void_t<decltype(std::declval<const T&>().abandoned())>>
      : std::true_type {};
  static void poke_transport(void* t) noexcept { transport_progress(*static_cast<Transport*>(t)); }
  static std::size_t abandoned_transfers(const Transport& t) noexcept {
    if constexpr (counts_abandoned<Transport>::value)
      return t.abandoned();
    else
      return 0;
  }
  // Moves the scratch buffers to a process-lifetime list (the data keeps its address: a vector
  // moves its heap block); where the list cannot grow, each block is leaked on its own.
  void quarantine() noexcept {
    quarantined_ = true;
    static std::mutex m;
    static auto* kept = new std::vector<std::vector<uchar>>();  // never freed, on purpose
    std::lock_guard<std::mutex> lock(m);
    for (auto& b : buffers_) {
      try {
        kept->push_back(std::move(b));
      } catch (...) {
        if (auto* leak = new (std::nothrow) std::vector<uchar>()) leak->swap(b);
      }
    }
    // Pool blocks: one more owner that is never released keeps each alive.
    static auto* kept_blocks = new std::vector<ScratchPool::Block>();  // never freed, on purpose
    for (auto& b : pool_blocks_) {
      try {
        kept_blocks->push_back(b);
      } catch (...) {
        if (auto* leak = new (std::nothrow) ScratchPool::Block()) *leak = b;
      }
    }
  }

  std::size_t add(int peer, int id, bool send, void* data, std::size_t bytes) {
    if (root_) {
      const int k = id - kFirstAlgorithmChannel;
      DTRAIN_ASSERT(k >= 0 && k < id_span_);
      return root_->add(transport_rank(peer), id_offset_ + k, send, data, bytes);
    }
    DTRAIN_ASSERT(!requests_);
    Channel c;
    c.peer = peer;
    c.id = id;
    c.send = send;
    c.bytes = bytes;
    c.raw = data;
    channels_.push_back(c);
    return channels_.size() - 1;
  }
  // The declared range holding channel c's message; every message lies in one (a plan that
  // sends from memory it did not declare is a bug in its algorithm).
  const Range& range_of(Channel& c) const {
    const auto* p = static_cast<const uchar*>(c.raw);
    for (std::size_t k = 0; k < regions_.size(); ++k) {
      const Range& r = regions_[k];
      if (p >= r.base && p + c.bytes <= r.base + r.bytes) {
        c.range = k;
        c.offset = static_cast<std::size_t>(p - r.base);
        return r;
      }
    }
    raise<Error>(name_of(spec_.kind), concat("plan message of ", c.bytes, " B to/from rank ",
                                             c.peer, " lies outside every registered buffer"));
  }

  CommState<Transport>* comm_;
  PlanSpec spec_;
  int size_, rank_;
  DType wdtype_ = DType::f32;
  std::size_t elem_bytes_ = 4;
  std::size_t seg_elems_ = 1;
  TransportCapabilities caps_;
  bool use_channels_;
  std::vector<Channel> channels_;
  std::unique_ptr<Request[]> requests_;
  std::vector<typename channel_type_of<Transport>::type> bound_;
  std::vector<std::vector<uchar>> buffers_;
  std::vector<ScratchPool::Block> pool_blocks_;  // the pool blocks this plan's scratch lies in
  std::size_t pool_used_ = 0;                    // end of this plan's last piece in the pool
  std::vector<Range> regions_;
  Fingerprint fingerprint_{};
  Deadline deadline_{-1};
  PlanContext* root_ = nullptr;  // the plan's own context, for a group view
  SharedSegments* segments_ = nullptr;
  std::vector<int> group_;  // group rank -> transport rank, for a group view
  int id_offset_ = 0, id_span_ = 0;
  bool quarantined_ = false;
};

/// One collective algorithm bound to a plan: the schedule is built by the constructor, run()
/// executes it once (blocking, on the calling thread).
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual void run() = 0;
};

}  // namespace dtrain::detail
