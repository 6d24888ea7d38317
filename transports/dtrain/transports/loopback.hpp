// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the loopback transport, N ranks as N threads of one process.
//
// Messages are matched in the receiver's mailbox and copied once, directly from the sender's
// buffer into the receiver's buffer, by whichever thread completes the match (rendezvous: a send
// completes when its data has been copied). Waiting threads sleep on a condition variable after a
// short spin, so more ranks than cores stay usable for tests.
//
// A world can instead model MPI's weak progress (LoopbackWorld::set_weak_progress): a send whose
// data has been copied completes only when its receiving rank next calls into its transport while
// it waits (a test that finds its own request unfinished, a wait that blocks, progress()), as an
// MPI library whose sender needs an acknowledgement that only the receiver's MPI calls send. The
// collectives must then stay correct: every wait of theirs has to keep the transport's progress
// going, also the waits that are not on a request.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain {

class LoopbackWorld;
class LoopbackTransport;

namespace detail {

/// One posted send or receive. Lives inside the caller's LoopbackTransport::Request, so posting
/// never allocates; it must not move while active.
struct LoopbackOp {
  // delivered: a send copied out under weak progress, waiting in the receiver's mailbox until the
  // receiving rank acknowledges it.
  enum State : int { idle = 0, posted = 1, matched = 2, done = 3, delivered = 4 };
  LoopbackOp* prev = nullptr;
  LoopbackOp* next = nullptr;
  std::atomic<int> state{idle};
  bool is_send = false;
  int owner = -1;  // rank that posted it
  int peer = -1;   // destination (send) or source (receive)
  int tag = 0;
  int mailbox = -1;  // rank whose mailbox queues it
  const void* send_data = nullptr;
  void* recv_data = nullptr;
  std::size_t bytes = 0;
  std::size_t peer_bytes = 0;  // the other side's size, for the mismatch message
  bool size_mismatch = false;
};

/// Intrusive FIFO of LoopbackOps.
struct LoopbackQueue {
  LoopbackOp* head = nullptr;
  LoopbackOp* tail = nullptr;
  void push(LoopbackOp* op) noexcept {
    op->next = nullptr;
    op->prev = tail;
    if (tail)
      tail->next = op;
    else
      head = op;
    tail = op;
  }
  void unlink(LoopbackOp* op) noexcept {
    if (op->prev)
      op->prev->next = op->next;
    else
      head = op->next;
    if (op->next)
      op->next->prev = op->prev;
    else
      tail = op->prev;
    op->prev = op->next = nullptr;
  }
  LoopbackOp* find(int peer, int tag) const noexcept {
    for (LoopbackOp* p = head; p; p = p->next)
      if (p->peer == peer && p->tag == tag) return p;
    return nullptr;
  }
  // Finds the first op whose owner is `owner` (a send queued for us) with the tag.
  LoopbackOp* find_owner(int owner, int tag) const noexcept {
    for (LoopbackOp* p = head; p; p = p->next)
      if (p->owner == owner && p->tag == tag) return p;
    return nullptr;
  }
};

struct LoopbackMailbox {
  std::mutex mutex;
  std::condition_variable cv;
  LoopbackQueue posted_recvs;   // receives posted by this rank, waiting for a send
  LoopbackQueue pending_sends;  // sends to this rank, waiting for a receive
  LoopbackQueue delivered;      // sends copied into this rank, waiting for its acknowledgement
};

}  // namespace detail

/// The shared state of N loopback ranks. Create one per group, then one LoopbackTransport per
/// rank (each used by its own thread). Thread-safe; must outlive its transports.
class LoopbackWorld {
 public:
  /// `size` ranks on one node; node-shared segments and node grouping from the environment
  /// (SharedSegmentConfig::from_env: DTRAIN_SHM, DTRAIN_SHM_SLOT_BYTES, DTRAIN_SHM_SLOTS,
  /// DTRAIN_RANKS_PER_NODE).
  explicit LoopbackWorld(int size) : LoopbackWorld(size, SharedSegmentConfig::from_env()) {}
  /// `size` ranks on one node with the given segment configuration (reads no environment).
  LoopbackWorld(int size, const SharedSegmentConfig& segments)
      : LoopbackWorld(std::vector<int>(size < 1 ? 1 : static_cast<std::size_t>(size), 0), segments,
                      size) {}
  /// One rank per entry of `node_of` (rank -> node label; equal labels share a node, so
  /// {0, 0, 0, 1} is a node of three ranks and one of one), with the given segment
  /// configuration (reads no environment; its ranks_per_node, when set, subdivides the nodes).
  LoopbackWorld(const std::vector<int>& node_of, const SharedSegmentConfig& segments)
      : LoopbackWorld(node_of, segments, static_cast<int>(node_of.size())) {}

 private:
  LoopbackWorld(const std::vector<int>& node_of, const SharedSegmentConfig& segments, int size)
      : size_(size) {
    DTRAIN_REQUIRE(size >= 1, "LoopbackWorld", "size " << size << " must be at least 1");
    node_map_ = NodeMap::subdivided(node_of, segments.ranks_per_node);
    boxes_.reserve(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) boxes_.push_back(std::make_unique<detail::LoopbackMailbox>());
    // All ranks share the address space, so node-shared segments are plain heap memory (pages
    // are touched only when the shm algorithm uses them); ranks alone on their node get none.
    seg_config_ = segments;
    if (seg_config_.enabled && size > 1) {
      const std::size_t bytes = seg_config_.segment_bytes();
      for (int i = 0; i < size; ++i) {
        if (node_map_.node_size(node_map_.node_of(i)) < 2) {
          segments_.emplace_back(nullptr);
          continue;
        }
        segments_.emplace_back(static_cast<unsigned char*>(std::aligned_alloc(
            SharedSegmentConfig::kPage, (bytes + SharedSegmentConfig::kPage - 1) /
                                            SharedSegmentConfig::kPage *
                                            SharedSegmentConfig::kPage)));
        if (!segments_.back()) raise<Error>("LoopbackWorld", "out of memory for shared segments");
        SharedSegments::init_flags(
            segments_.back().get() + seg_config_.slots * seg_config_.slot_bytes, seg_config_.slots);
      }
    }
  }

 public:
  LoopbackWorld(const LoopbackWorld&) = delete;
  LoopbackWorld& operator=(const LoopbackWorld&) = delete;

  int size() const noexcept { return size_; }
  /// Models MPI's weak progress (test knob; off by default): from now on a send whose data was
  /// copied completes only once its receiving rank calls into its transport while it waits, or
  /// calls progress(). Call before the ranks run. Not thread-safe.
  void set_weak_progress(bool on) noexcept { weak_progress_ = on; }
  bool weak_progress() const noexcept { return weak_progress_; }
  /// The node of every rank (one node unless the world was given a map or ranks_per_node).
  const NodeMap& node_map() const noexcept { return node_map_; }

  /// Marks the world failed (a rank's thread threw): every wait in every rank then throws
  /// RemoteError instead of running into its deadline. Thread-safe.
  void abort(int failed_rank, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (aborted_.load()) return;
      abort_message_ = "rank " + std::to_string(failed_rank) + " failed: " + why;
      aborted_.store(true);
    }
    for (auto& b : boxes_) {
      std::lock_guard<std::mutex> lock(b->mutex);
      b->cv.notify_all();
    }
  }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  std::string abort_message() const {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    return abort_message_;
  }

 private:
  friend class LoopbackTransport;
  detail::LoopbackMailbox& box(int r) { return *boxes_[static_cast<std::size_t>(r)]; }

  struct FreeDeleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };
  int size_;
  NodeMap node_map_;
  std::vector<std::unique_ptr<detail::LoopbackMailbox>> boxes_;
  SharedSegmentConfig seg_config_;
  std::vector<std::unique_ptr<unsigned char, FreeDeleter>> segments_;
  std::atomic<bool> aborted_{false};
  bool weak_progress_ = false;
  mutable std::mutex abort_mutex_;
  std::string abort_message_;
};

/// One rank of a LoopbackWorld. Satisfies is_transport_v. Local object of its rank; its
/// operations may be called by any one thread at a time (the owner or a progress thread).
class LoopbackTransport {
 public:
  /// Handle of one send or receive; must not move while active.
  struct Request {
    detail::LoopbackOp op;
    Request() = default;
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
  };

  /// A bound message: start posts it as isend / irecv with the channel id as tag (one address
  /// space needs no more; the channel path of the plans is exercised all the same).
  struct Channel {
    int peer = -1;
    int tag = 0;
    void* data = nullptr;
    std::size_t bytes = 0;
    bool is_send = false;
  };

  // Capabilities (transport_capabilities reads these): host memory, no registration needed.
  static constexpr bool supports_device_memory = false;
  static constexpr bool requires_registration = false;
  static constexpr bool one_sided = false;
  static constexpr bool thread_safe = true;

  LoopbackTransport(LoopbackWorld& world, int rank) : world_(&world), rank_(rank) {
    DTRAIN_REQUIRE(rank >= 0 && rank < world.size(), "LoopbackTransport",
                   "rank " << rank << " outside world of " << world.size());
    acked_.assign(static_cast<std::size_t>(world.size()), 0);
    const NodeMap& nodes = world.node_map();
    const std::vector<int>& mine = nodes.members(nodes.node_of(rank));
    if (!world.segments_.empty() && world.segments_[static_cast<std::size_t>(rank)]) {
      const auto& c = world.seg_config_;
      segments_.rank = nodes.local_rank(rank);
      segments_.size = static_cast<int>(mine.size());
      segments_.slots = c.slots;
      segments_.slot_bytes = c.slot_bytes;
      std::vector<unsigned char*> heaps;
      for (int q : mine) {
        unsigned char* seg = world.segments_[static_cast<std::size_t>(q)].get();
        segments_.data.push_back(seg);
        segments_.flags.push_back(
            reinterpret_cast<std::atomic<std::uint64_t>*>(seg + c.slots * c.slot_bytes));
        if (c.heap_bytes) heaps.push_back(seg + c.heap_offset());
      }
      segments_.set_heaps(std::move(heaps), c.heap_bytes);
    }
  }

  /// The world's shared segments (every thread maps them) when the world is one node, or null
  /// (a world of one rank, several nodes, or DTRAIN_SHM=0). Used by the shm all-reduce.
  SharedSegments* shared_segments() noexcept {
    return segments_.data.empty() || world_->node_map().nodes() > 1 ? nullptr : &segments_;
  }
  /// Segments shared by the ranks of this rank's node, indexed by rank within the node (null
  /// for a rank alone on its node or with DTRAIN_SHM=0). Used by the hierarchical all-reduce.
  SharedSegments* node_segments() noexcept { return segments_.data.empty() ? nullptr : &segments_; }
  /// The world's node grouping.
  const NodeMap& node_map() const noexcept { return world_->node_map(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_->size(); }
  LoopbackWorld& world() noexcept { return *world_; }

  /// Non-blocking send of `bytes` bytes to `peer`. The buffer must stay valid and unchanged until
  /// the request completes.
  void isend(Request& r, int peer, int tag, const void* data, std::size_t bytes) {
    check_peer(peer, "loopback isend");
    auto& op = prepare(r, true, peer, tag, bytes);
    op.send_data = data;
    op.mailbox = peer;
    auto& box = world_->box(peer);
    detail::LoopbackOp* match = nullptr;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      match = box.posted_recvs.find(rank_, tag);
      if (match) {
        box.posted_recvs.unlink(match);
        match->state.store(detail::LoopbackOp::matched, std::memory_order_relaxed);
        op.state.store(detail::LoopbackOp::matched, std::memory_order_relaxed);
      } else {
        op.state.store(detail::LoopbackOp::posted, std::memory_order_relaxed);
        box.pending_sends.push(&op);
      }
    }
    if (match) complete(&op, match);
  }

  /// Non-blocking receive of exactly `bytes` bytes from `peer` into `data`.
  void irecv(Request& r, int peer, int tag, void* data, std::size_t bytes) {
    check_peer(peer, "loopback irecv");
    auto& op = prepare(r, false, peer, tag, bytes);
    op.recv_data = data;
    op.mailbox = rank_;
    auto& box = world_->box(rank_);
    detail::LoopbackOp* match = nullptr;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      match = box.pending_sends.find_owner(peer, tag);
      if (match) {
        box.pending_sends.unlink(match);
        match->state.store(detail::LoopbackOp::matched, std::memory_order_relaxed);
        op.state.store(detail::LoopbackOp::matched, std::memory_order_relaxed);
      } else {
        op.state.store(detail::LoopbackOp::posted, std::memory_order_relaxed);
        box.posted_recvs.push(&op);
      }
    }
    if (match) complete(match, &op);
  }

  /// True once the request completed (an idle request counts as complete). Throws
  /// TransportError when the matched sizes differed, RemoteError when the world was aborted.
  bool test(Request& r) {
    const int s = r.op.state.load(std::memory_order_acquire);
    if (s == detail::LoopbackOp::done) {
      finish(r);
      return true;
    }
    if (s == detail::LoopbackOp::idle) return true;
    if (world_->aborted()) raise_aborted();
    progress();
    return false;
  }

  /// Acknowledges the sends copied into this rank's receives, completing them, when the world
  /// models weak progress (LoopbackWorld::set_weak_progress); nothing otherwise. Local,
  /// non-blocking; callable by the thread that may use this transport.
  void progress() noexcept {
    if (!world_->weak_progress()) return;
    auto& box = world_->box(rank_);
    int owners = 0;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      while (detail::LoopbackOp* op = box.delivered.head) {
        box.delivered.unlink(op);
        if (!acked_[static_cast<std::size_t>(op->owner)]) {
          acked_[static_cast<std::size_t>(op->owner)] = 1;
          ++owners;
        }
        // After this store the sender may reuse the op.
        op->state.store(detail::LoopbackOp::done, std::memory_order_release);
      }
    }
    for (std::size_t q = 0; owners > 0 && q < acked_.size(); ++q) {
      if (!acked_[q]) continue;
      acked_[q] = 0;
      --owners;
      auto& b = world_->box(static_cast<int>(q));
      std::lock_guard<std::mutex> lock(b.mutex);
      b.cv.notify_all();
    }
  }

  /// Blocks until the request completes (true) or the deadline passes (false).
  bool wait_until(Request& r, const Deadline& deadline) {
    // Spinning, then yielding (detail/backoff.hpp) catches the common case of a partner that is
    // already running, without the cost of a sleep and wake-up; after that the thread blocks on
    // its mailbox's condition variable.
    detail::Backoff backoff;
    while (!backoff.past_yield()) {
      if (test(r)) return true;
      if (deadline.expired()) return test(r);
      backoff.pause();
    }
    auto& box = world_->box(rank_);
    std::unique_lock<std::mutex> lock(box.mutex);
    auto ready = [&] {
      const int s = r.op.state.load(std::memory_order_acquire);
      return s == detail::LoopbackOp::done || s == detail::LoopbackOp::idle || world_->aborted();
    };
    while (!ready()) {
      if (box.delivered.head) {  // weak progress: acknowledge, as a blocked MPI wait would
        lock.unlock();
        progress();
        lock.lock();
        continue;
      }
      const double left = deadline.remaining();
      if (left <= 0) return false;
      const auto step = std::chrono::duration<double>(std::min(left, 0.5));
      box.cv.wait_for(lock, step);
    }
    lock.unlock();
    if (test(r)) return true;
    if (world_->aborted()) raise_aborted();
    return false;
  }

  /// Abandons an active request (error paths): a queued one is removed; one being copied right
  /// now is waited for. Never throws.
  void cancel(Request& r) noexcept {
    auto& op = r.op;
    int s = op.state.load(std::memory_order_acquire);
    if (s == detail::LoopbackOp::idle) return;
    if (s == detail::LoopbackOp::posted) {
      auto& box = world_->box(op.mailbox);
      std::lock_guard<std::mutex> lock(box.mutex);
      if (op.state.load(std::memory_order_acquire) == detail::LoopbackOp::posted) {
        (op.is_send ? box.pending_sends : box.posted_recvs).unlink(&op);
        op.state.store(detail::LoopbackOp::idle, std::memory_order_release);
        return;
      }
    }
    detail::Backoff backoff;
    while (op.state.load(std::memory_order_acquire) == detail::LoopbackOp::matched) backoff.pause();
    if (op.state.load(std::memory_order_acquire) == detail::LoopbackOp::delivered) {
      auto& box = world_->box(op.mailbox);
      std::lock_guard<std::mutex> lock(box.mutex);
      if (op.state.load(std::memory_order_acquire) == detail::LoopbackOp::delivered)
        box.delivered.unlink(&op);
    }
    op.state.store(detail::LoopbackOp::idle, std::memory_order_release);
  }

  /// Binds a send of `bytes` at `offset` in `region` to `peer` as channel `channel_id`. Local.
  Channel bind_send(int peer, int channel_id, const MemoryRegion& region, std::size_t offset,
                    std::size_t bytes) {
    check_peer(peer, "loopback bind_send");
    return Channel{peer, channel_id, static_cast<unsigned char*>(region.data) + offset, bytes,
                   true};
  }
  /// Binds a receive from `peer`. Local.
  Channel bind_recv(int peer, int channel_id, const MemoryRegion& region, std::size_t offset,
                    std::size_t bytes) {
    check_peer(peer, "loopback bind_recv");
    return Channel{peer, channel_id, static_cast<unsigned char*>(region.data) + offset, bytes,
                   false};
  }
  /// Posts the channel's message; `r` completes it like any request.
  void start(Request& r, Channel& c) {
    if (c.is_send)
      isend(r, c.peer, c.tag, c.data, c.bytes);
    else
      irecv(r, c.peer, c.tag, c.data, c.bytes);
  }
  void unbind(Channel& c) noexcept { c = Channel{}; }

  /// Registration is not needed in one address space: returns the range unchanged.
  MemoryRegion register_memory(void* data, std::size_t bytes, Space space) {
    DTRAIN_REQUIRE(space == Space::host, "loopback register_memory",
                   "the loopback transport moves host memory only, got " << name_of(space));
    return MemoryRegion{data, bytes, space, 0, nullptr};
  }
  void deregister_memory(MemoryRegion&) noexcept {}

  bool allows_progress_thread() const noexcept { return true; }

 private:
  void check_peer(int peer, const char* op) const {
    DTRAIN_REQUIRE(peer >= 0 && peer < size() && peer != rank_, op,
                   "peer " << peer << " invalid for rank " << rank_ << " of " << size());
    if (world_->aborted()) raise_aborted();
  }

  detail::LoopbackOp& prepare(Request& r, bool is_send, int peer, int tag, std::size_t bytes) {
    auto& op = r.op;
    DTRAIN_ASSERT(op.state.load(std::memory_order_acquire) == detail::LoopbackOp::idle ||
                  op.state.load(std::memory_order_acquire) == detail::LoopbackOp::done);
    op.is_send = is_send;
    op.owner = rank_;
    op.peer = peer;
    op.tag = tag;
    op.bytes = bytes;
    op.peer_bytes = 0;
    op.size_mismatch = false;
    op.send_data = nullptr;
    op.recv_data = nullptr;
    return op;
  }

  // Copies the matched pair outside every lock, then wakes both owners.
  void complete(detail::LoopbackOp* send, detail::LoopbackOp* recv) {
    if (send->bytes == recv->bytes) {
      if (send->bytes) std::memcpy(recv->recv_data, send->send_data, send->bytes);
    } else {
      send->size_mismatch = recv->size_mismatch = true;
    }
    send->peer_bytes = recv->bytes;
    recv->peer_bytes = send->bytes;
    const int send_owner = send->owner, recv_owner = recv->owner;
    if (world_->weak_progress()) {
      auto& box = world_->box(recv_owner);
      {
        std::lock_guard<std::mutex> lock(box.mutex);
        send->state.store(detail::LoopbackOp::delivered, std::memory_order_release);
        box.delivered.push(send);
        recv->state.store(detail::LoopbackOp::done, std::memory_order_release);
        box.cv.notify_all();
      }
      return;
    }
    send->state.store(detail::LoopbackOp::done, std::memory_order_release);
    recv->state.store(detail::LoopbackOp::done, std::memory_order_release);
    // After the stores above the owners may reuse the ops: only the saved ranks are used below.
    for (int owner : {send_owner, recv_owner}) {
      auto& box = world_->box(owner);
      std::lock_guard<std::mutex> lock(box.mutex);
      box.cv.notify_all();
    }
  }

  void finish(Request& r) {
    auto& op = r.op;
    op.state.store(detail::LoopbackOp::idle, std::memory_order_relaxed);
    if (op.size_mismatch) {
      op.size_mismatch = false;
      raise<TransportError>(
          op.is_send ? "loopback send" : "loopback receive",
          detail::concat(op.is_send ? "to rank " : "from rank ", op.peer, " tag ", op.tag, ": ",
                         op.bytes, " B posted here but ", op.peer_bytes, " B on the peer"));
    }
  }

  [[noreturn]] void raise_aborted() const {
    raise<RemoteError>("loopback transport", world_->abort_message());
  }

  LoopbackWorld* world_;
  int rank_;
  SharedSegments segments_;
  std::vector<char> acked_;  // progress(): the ranks whose sends it completed
};

static_assert(detail::check_transport<LoopbackTransport>(), "");

/// Runs `body` on one thread per rank of `world` (a fresh world, used once). Each thread gets its
/// own LoopbackTransport and has its rank set for error messages. When a rank throws, the world is
/// aborted (the other ranks' waits throw RemoteError instead of hanging); after all threads are
/// joined the first exception thrown is rethrown. Under weak progress a rank whose body returned
/// keeps acknowledging its peers' sends until every body returned (as MPI_Finalize would).
/// Blocking; call from any thread.
inline void run_loopback(LoopbackWorld& world,
                         const std::function<void(LoopbackTransport&)>& body) {
  const int n = world.size();
  std::atomic<int> returned{0};
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      detail::RankScope scope(r);
      try {
        LoopbackTransport t(world, r);
        body(t);
        returned.fetch_add(1);
        for (detail::Backoff b; world.weak_progress() && returned.load() < n && !world.aborted();
             b.pause())
          t.progress();
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(m);
          if (!first) first = std::current_exception();
        }
        world.abort(r, e.what());
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(m);
          if (!first) first = std::current_exception();
        }
        world.abort(r, "unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

/// run_loopback on a fresh LoopbackWorld of `n` ranks (configured from the environment).
inline void run_loopback(int n, const std::function<void(LoopbackTransport&)>& body) {
  LoopbackWorld world(n);
  run_loopback(world, body);
}

}  // namespace dtrain
