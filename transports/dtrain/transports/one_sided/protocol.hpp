// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the one-sided protocol, written once over a narrow backend (see backend.hpp), which
// turns one-sided writes with notifications into the two-sided transport vocabulary every
// collective uses (transport_traits.hpp).
//
// Per ordered pair of ranks (sender s, receiver r):
//  - r owns `slots` slots of `slot_bytes` in one registered region (remote write for s only
//    through its key), and s mirrors them with as many local staging slots;
//  - every notified write from s to r carries a sequence number k (its 32-bit immediate value
//    holds the kind, k mod 2^14 and a 16-bit payload); r consumes notifications strictly in
//    order, so a lost, duplicated or stale notification is an error, never consumed;
//  - s may post notification k only when r has consumed notification k - slots: r returns
//    credits by storing its consumed count into a word at s (credit-based flow control, so a
//    write never lands in a slot r still uses and r's receive queue cannot overflow);
//  - messages up to slot_bytes - 64 go eager: header + payload copied into staging slot k mod
//    slots, written to r's slot k mod slots, notified. r copies the payload straight into the
//    matching posted receive, or out to an unexpected-message store (so slots free at once);
//  - larger messages go zero-copy: the receive sends a clear-to-send (CTS, an eager control
//    message) with the registered destination address, key and a receive token; the send,
//    matched with it by tag in order, writes the user buffer straight into the user buffer at r
//    with a notification naming the token, and completes once the write completed locally.
// Both sides choose eager or zero-copy from the byte count alone, which a receive names
// exactly; sizes are checked on both paths. Registrations made through register_memory (a plan's
// buffers) are cached by (address, length) until deregistered; other buffers are registered for
// the one message and released when it completes.
// The first failed work completion becomes the transport's error: it is thrown from the call
// that saw it and from every later test/wait; completions flushed after it are not reported.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/detect.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/one_sided/backend.hpp>

namespace dtrain {

/// Settings of the one-sided protocol; every rank must use the same values. Plain value type.
struct OneSidedConfig {
  /// Credits per peer: notified writes a sender may have outstanding at one receiver (>= 4).
  int slots = 16;
  /// Bytes of one eager slot, header included (>= 128, multiple of 64). Messages up to
  /// slot_bytes - 64 bytes go eager (copied once on each side); larger ones go zero-copy.
  std::size_t slot_bytes = 8192;
};

namespace detail::rma {

/// Kinds of a notification's immediate value (top two bits).
enum : std::uint32_t { kSlot = 1, kData = 2 };
/// Kinds of a slot's content.
enum : std::uint32_t { kEager = 1, kCts = 2 };

inline std::uint32_t encode_imm(std::uint32_t kind, std::uint64_t seq, std::uint32_t payload) {
  return (kind << 30) | ((static_cast<std::uint32_t>(seq) & 0x3fffu) << 16) | (payload & 0xffffu);
}

/// Header at the start of every slot (64 bytes).
struct SlotHeader {
  std::uint64_t seq;
  std::uint64_t bytes;
  std::int32_t tag;
  std::uint32_t kind;
  std::uint64_t addr;  // CTS: destination address and key, receive token
  std::uint64_t rkey;
  std::uint32_t token;
  std::uint32_t pad0;
  std::uint64_t pad1[2];
};
static_assert(sizeof(SlotHeader) == 64, "slot header is one cache line");

/// What every rank publishes at start-up.
struct Bootstrap {
  std::uint64_t inbox_addr, inbox_rkey, credit_addr, credit_rkey;
};

constexpr std::size_t kCreditStride = 64;  // one credit word per cache line

}  // namespace detail::rma

/// A transport (is_transport_v) running the one-sided protocol over backend B. Construction is
/// collective over the backend's group (bootstrap: every rank publishes its slot and credit
/// addresses). Local object of its rank; used by one thread at a time (owner or progress thread).
template <class B>
class OneSidedTransport {
  using Region = one_sided::Region;
  using RemoteAddr = one_sided::RemoteAddr;
  using Event = one_sided::Event;

 public:
  static constexpr bool supports_device_memory = false;
  /// Plans register every buffer they move (unregistered ones still work, registered per message).
  static constexpr bool requires_registration = true;
  static constexpr bool one_sided = true;
  static constexpr bool thread_safe = true;

  /// Handle of one send or receive; must not move or be destroyed while active.
  class Request {
   public:
    Request() = default;
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

   private:
    friend class OneSidedTransport;
    enum class St : unsigned char { idle, queued, waiting, inflight, done };
    enum class Act : unsigned char { none, eager, cts, data };
    St st = St::idle;
    Act act = Act::none;
    bool recv = false;
    int list = 0;
    int peer = -1;
    int tag = 0;
    const void* src = nullptr;
    void* dst = nullptr;
    std::size_t bytes = 0;
    std::uint32_t token = 0;
    std::uint64_t post = 0;
    RemoteAddr remote;
    Region reg;
    bool temp = false;
    Request* prev = nullptr;
    Request* next = nullptr;
  };

  /// Collective: builds the backend from `backend_args` and bootstraps with default settings.
  template <class A0, class... A,
            class = std::enable_if_t<!std::is_same_v<std::decay_t<A0>, OneSidedConfig>>>
  explicit OneSidedTransport(A0&& backend_arg0, A&&... backend_args)
      : OneSidedTransport(OneSidedConfig{}, std::forward<A0>(backend_arg0),
                          std::forward<A>(backend_args)...) {}

  /// Collective: as above with explicit protocol settings (the same on every rank).
  template <class... A>
  explicit OneSidedTransport(const OneSidedConfig& cfg, A&&... backend_args)
      : backend_(std::forward<A>(backend_args)...), cfg_(cfg) {
    DTRAIN_REQUIRE(cfg.slots >= 4 && cfg.slots <= 4096, op_name("setup"),
                   "slots " << cfg.slots << " outside 4..4096");
    DTRAIN_REQUIRE(cfg.slot_bytes >= 128 && cfg.slot_bytes % 64 == 0, op_name("setup"),
                   "slot_bytes " << cfg.slot_bytes << " must be >= 128 and a multiple of 64");
    size_ = backend_.size();
    rank_ = backend_.rank();
    slots_ = static_cast<std::size_t>(cfg.slots);
    eager_limit_ = cfg.slot_bytes - sizeof(detail::rma::SlotHeader);
    const std::size_t block = slots_ * cfg.slot_bytes;
    const std::size_t all = block * static_cast<std::size_t>(size_);
    inbox_mem_.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, round_up(all))));
    staging_mem_.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, round_up(all))));
    credit_mem_.reset(static_cast<unsigned char*>(
        std::aligned_alloc(4096, round_up(size_ * detail::rma::kCreditStride))));
    if (!inbox_mem_ || !staging_mem_ || !credit_mem_)
      raise<TransportError>(op_name("setup"), "out of memory for slots");
    std::memset(inbox_mem_.get(), 0, all);
    std::memset(credit_mem_.get(), 0, round_up(size_ * detail::rma::kCreditStride));
    inbox_reg_ = backend_.register_memory(inbox_mem_.get(), all, one_sided::Access::remote_write);
    staging_reg_ = backend_.register_memory(staging_mem_.get(), all, one_sided::Access::local);
    credit_reg_ = backend_.register_memory(credit_mem_.get(), size_ * detail::rma::kCreditStride,
                                           one_sided::Access::remote_write);
    const detail::rma::Bootstrap mine{inbox_reg_.addr, inbox_reg_.rkey, credit_reg_.addr,
                                      credit_reg_.rkey};
    std::vector<detail::rma::Bootstrap> boot(static_cast<std::size_t>(size_));
    backend_.exchange(&mine, sizeof mine, boot.data());
    peers_.resize(static_cast<std::size_t>(size_));
    for (int q = 0; q < size_; ++q) {
      Peer& P = peers_[static_cast<std::size_t>(q)];
      const auto& bq = boot[static_cast<std::size_t>(q)];
      P.slots =
          RemoteAddr{bq.inbox_addr + static_cast<std::uint64_t>(rank_) * block, bq.inbox_rkey};
      P.credit = RemoteAddr{bq.credit_addr + rank_ * detail::rma::kCreditStride, bq.credit_rkey};
      P.staging = staging_mem_.get() + static_cast<std::size_t>(q) * block;
      P.inbox = inbox_mem_.get() + static_cast<std::size_t>(q) * block;
      P.credit_word = reinterpret_cast<const std::uint64_t*>(
          credit_mem_.get() + static_cast<std::size_t>(q) * detail::rma::kCreditStride);
      P.staging_post.assign(slots_, 0);
      P.outq.id = kOutq;
      P.rndv_sends.id = kRndvSends;
      P.inflight.id = kInflight;
      P.eager_recvs.id = kEagerRecvs;
    }
    backend_.open(cfg.slots);
  }

  /// Collective unless failing (an exception propagating, a transport error, an operation
  /// abandoned with cancel, or the job failing): the ranks meet (backend close) before any
  /// deregisters memory that peers might still write into (a late credit return). When a failing
  /// backend says peers or its own writes may still touch this rank's memory (keeps_memory:
  /// MPI-RMA, where a late put lands whether or not the range is still attached), the slots,
  /// staging and credit memory (handed to the backend's keep) and every registration are kept
  /// for the rest of the process.
  ~OneSidedTransport() {
    backend_.close(unwind_.failing() || error_ != nullptr || cancelled_);
    if constexpr (has_keeps_memory<B>::value) {
      if (backend_.keeps_memory()) {
        backend_.keep(inbox_mem_.release());
        backend_.keep(staging_mem_.release());
        backend_.keep(credit_mem_.release());
        return;
      }
    }
    for (auto& e : cache_) release(e.second);
    backend_.deregister_memory(credit_reg_);
    backend_.deregister_memory(staging_reg_);
    backend_.deregister_memory(inbox_reg_);
  }
  OneSidedTransport(const OneSidedTransport&) = delete;
  OneSidedTransport& operator=(const OneSidedTransport&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The backend (for its own queries, e.g. the MPI communicator); local.
  B& backend() noexcept { return backend_; }
  /// The node of every rank, where the backend knows it (MPI-RMA: MPI_COMM_TYPE_SHARED groups,
  /// cut as DTRAIN_RANKS_PER_NODE says); the hierarchical all-reduce groups by it. Local.
  template <class BB = B, class = decltype(std::declval<const BB&>().node_map())>
  const NodeMap& node_map() const noexcept {
    return backend_.node_map();
  }
  /// Messages up to this many bytes go eager through the slots.
  std::size_t eager_limit() const noexcept { return eager_limit_; }
  bool allows_progress_thread() const { return backend_.allows_progress_thread(); }
  /// Local, never throws; only where the backend knows its peers' processes (MPI-RMA): what
  /// Linux reports about `peer`'s process when it runs on this node (detail/peer_liveness.hpp).
  /// Timeout messages use it to name a stopped or exited rank.
  template <class BB = B, class = decltype(std::declval<const BB&>().peer_status(0))>
  detail::PeerStatus peer_status(int peer) const noexcept {
    return backend_.peer_status(peer);
  }

  /// Non-blocking send of `bytes` bytes to `peer`; the buffer must stay valid and unchanged
  /// until the request completes. An eager send completes once copied into a staging slot.
  void isend(Request& r, int peer, int tag, const void* data, std::size_t bytes) {
    DTRAIN_REQUIRE(tag >= 0, op_name("send"), "tag " << tag << " is negative");
    post_send(r, peer, tag, data, bytes, nullptr);
  }

  /// Non-blocking receive of exactly `bytes` bytes from `peer` into `data`.
  void irecv(Request& r, int peer, int tag, void* data, std::size_t bytes) {
    DTRAIN_REQUIRE(tag >= 0, op_name("receive"), "tag " << tag << " is negative");
    post_recv(r, peer, tag, data, bytes, nullptr);
  }

  /// A persistent, plan-scoped message (transport_channels.hpp): its peer, bytes and registration
  /// are resolved once at bind time, so a start neither looks up nor registers memory. Each start
  /// still goes through the protocol (eager slot, or clear-to-send + zero-copy write), because
  /// the receiver's buffer is only known to be free once its channel was started again.
  struct Channel {
    int peer = -1;
    int tag = -1;
    bool send = false;
    unsigned char* data = nullptr;
    std::size_t bytes = 0;
    Region reg;
    bool has_reg = false;
  };
  /// Local: binds a send of [offset, offset+bytes) of `region` (from register_memory) to `peer`.
  Channel bind_send(int peer, int channel_id, const MemoryRegion& region, std::size_t offset,
                    std::size_t bytes) {
    return bind(peer, channel_id, region, offset, bytes, true);
  }
  /// Local: binds a receive of exactly `bytes` bytes from `peer` into `region` at `offset`.
  Channel bind_recv(int peer, int channel_id, const MemoryRegion& region, std::size_t offset,
                    std::size_t bytes) {
    return bind(peer, channel_id, region, offset, bytes, false);
  }
  /// Posts the bound message once; complete it with test / wait_until.
  void start(Request& r, Channel& c) {
    const Region* pre = c.has_reg ? &c.reg : nullptr;
    if (c.send)
      post_send(r, c.peer, c.tag, c.data, c.bytes, pre);
    else
      post_recv(r, c.peer, c.tag, c.data, c.bytes, pre);
  }
  /// Releases nothing: the registration belongs to the plan's register_memory.
  void unbind(Channel& c) noexcept { c = Channel{}; }

 private:
  void post_send(Request& r, int peer, int tag, const void* data, std::size_t bytes,
                 const Region* pre) {
    begin_op(r, peer, tag, false, bytes, "send");
    r.src = data;
    Peer& P = peer_of(peer);
    if (bytes <= eager_limit_) {
      r.act = Request::Act::eager;
      enqueue(P, peer, r);
      return;
    }
    if (pre)
      r.reg = *pre;
    else
      lookup(r, data, bytes, one_sided::Access::local);
    // A clear-to-send that arrived before this send was posted.
    for (auto it = P.early_cts.begin(); it != P.early_cts.end(); ++it)
      if (it->tag == tag) {
        const Cts c = *it;
        P.early_cts.erase(it);
        accept_cts(P, peer, r, c);
        return;
      }
    r.st = Request::St::waiting;
    P.rndv_sends.push(&r);
  }

  void post_recv(Request& r, int peer, int tag, void* data, std::size_t bytes, const Region* pre) {
    begin_op(r, peer, tag, true, bytes, "receive");
    r.dst = data;
    Peer& P = peer_of(peer);
    if (bytes <= eager_limit_) {
      for (auto it = P.unexpected.begin(); it != P.unexpected.end(); ++it)
        if (it->tag == tag) {
          check_size(r, it->data.size());
          if (bytes) std::memcpy(data, it->data.data(), bytes);
          pool_.push_back(std::move(it->data));
          P.unexpected.erase(it);
          r.st = Request::St::done;
          return;
        }
      r.st = Request::St::waiting;
      P.eager_recvs.push(&r);
      return;
    }
    if (pre)
      r.reg = *pre;
    else
      lookup(r, data, bytes, one_sided::Access::remote_write);
    if (P.free_tokens.empty()) {
      DTRAIN_REQUIRE(P.tokens.size() < 65536, op_name("receive"),
                     "more than 65536 zero-copy receives from rank " << peer << " outstanding");
      P.free_tokens.push_back(static_cast<std::uint32_t>(P.tokens.size()));
      P.tokens.push_back(nullptr);
      P.token_state.push_back(0);
    }
    r.token = P.free_tokens.back();
    P.free_tokens.pop_back();
    P.tokens[r.token] = &r;
    P.token_state[r.token] = 1;
    r.act = Request::Act::cts;
    enqueue(P, peer, r);
  }

 public:
  /// True once the request completed (an idle request counts as complete). Drives the
  /// protocol. Throws TransportError after a failure (the first failure's message).
  bool test(Request& r) {
    if (r.st == Request::St::done) {
      r.st = Request::St::idle;
      return true;
    }
    if (r.st == Request::St::idle) return true;
    progress();
    if (r.st != Request::St::done) return false;
    r.st = Request::St::idle;
    return true;
  }

  /// Blocks until the request completes (true) or the deadline passes (false), spinning first,
  /// then yielding, then sleeping 20 us between polls after 2 ms.
  bool wait_until(Request& r, const Deadline& deadline) {
    if (test(r)) return true;
    const double start = now_seconds();
    for (unsigned i = 1;; ++i) {
      if (test(r)) return true;
      if ((i & 15u) == 0) {
        backend_.check_alive();
        if (deadline.expired()) return false;
        const double waited = now_seconds() - start;
        if (waited > 2e-3)
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        else if (waited > 5e-6)
          std::this_thread::yield();
      }
    }
  }

  /// Abandons an active request (error paths). A zero-copy receive's token is retired, so a
  /// late notification for it is ignored. A zero-copy receive whose clear-to-send already went
  /// out (the peer knows the buffer's address and may still write into it) and a write still in
  /// flight (the backend may still read its source) are counted in abandoned(): their memory
  /// must stay allocated (a plan quarantines its own). Never throws.
  void cancel(Request& r) noexcept {
    if (r.st == Request::St::idle || r.st == Request::St::done) {
      r.st = Request::St::idle;
      return;
    }
    const bool cts_sent =
        r.recv && r.bytes > eager_limit_ && r.st == Request::St::waiting && r.list != kEagerRecvs;
    if (cts_sent || r.st == Request::St::inflight) ++abandoned_;
    cancelled_ = true;
    Peer& P = peers_[static_cast<std::size_t>(r.peer)];
    switch (r.list) {
      case kOutq: P.outq.unlink(&r); break;
      case kRndvSends: P.rndv_sends.unlink(&r); break;
      case kInflight: P.inflight.unlink(&r); break;
      case kEagerRecvs: P.eager_recvs.unlink(&r); break;
      default: break;
    }
    if (r.recv && r.bytes > eager_limit_ && r.token < P.tokens.size() && P.tokens[r.token] == &r) {
      P.tokens[r.token] = nullptr;
      P.token_state[r.token] = 2;  // retired, never reused
    }
    drop_temp(r);
    r.st = Request::St::idle;
  }

  /// Local. How many cancelled operations may still have their memory accessed (see cancel).
  std::size_t abandoned() const noexcept { return abandoned_; }

  /// Records a range the caller will send from or receive into (a plan's buffers), so the hot
  /// path finds it registered: registered for local access now, for remote writes on the first
  /// zero-copy receive into it; kept until deregister_memory (counted per (address, length)).
  MemoryRegion register_memory(void* data, std::size_t bytes, Space space) {
    DTRAIN_REQUIRE(space == Space::host, op_name("register_memory"),
                   "the one-sided transports move host memory only, got " << name_of(space));
    auto key = std::make_pair(reinterpret_cast<std::uintptr_t>(data), bytes);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      it = cache_.emplace(key, CacheEntry{}).first;
      it->second.local = backend_.register_memory(data, bytes, one_sided::Access::local);
      it->second.has_local = true;
    }
    ++it->second.refs;
    return MemoryRegion{data, bytes, space, it->second.local.rkey, &it->second};
  }
  /// Releases one registration made by register_memory. Never throws.
  void deregister_memory(MemoryRegion& m) noexcept {
    if (!m.data || !m.bytes) return;
    auto it = cache_.find(std::make_pair(reinterpret_cast<std::uintptr_t>(m.data), m.bytes));
    if (it != cache_.end() && --it->second.refs == 0) {
      release(it->second);
      cache_.erase(it);
    }
    m = MemoryRegion{};
  }

 private:
  enum { kNone = 0, kOutq, kRndvSends, kInflight, kEagerRecvs };

  // Channel tags are negative (-1 - id), so they never meet isend / irecv tags.
  Channel bind(int peer, int id, const MemoryRegion& region, std::size_t offset, std::size_t bytes,
               bool send) {
    DTRAIN_REQUIRE(
        peer >= 0 && peer < size_ && peer != rank_ && id >= 0 && offset + bytes <= region.bytes,
        op_name(send ? "bind_send" : "bind_recv"),
        "peer " << peer << ", channel " << id << ", " << bytes << " B at offset " << offset
                << " of a " << region.bytes << " B region");
    Channel c;
    c.peer = peer;
    c.tag = -1 - id;
    c.send = send;
    c.data = static_cast<unsigned char*>(region.data) + offset;
    c.bytes = bytes;
    // The plan's own registration (register_memory put its cache entry in `handle`), never
    // another plan's that happens to cover the same addresses and may be released first.
    if (bytes > eager_limit_ && region.handle) {
      CacheEntry& e = *static_cast<CacheEntry*>(region.handle);
      void* base = region.data;
      if (send) {
        if (!e.has_local) {
          e.local = backend_.register_memory(base, region.bytes, one_sided::Access::local);
          e.has_local = true;
        }
        c.reg = e.local;
      } else {
        if (!e.has_remote) {
          e.remote = backend_.register_memory(base, region.bytes, one_sided::Access::remote_write);
          e.has_remote = true;
        }
        c.reg = e.remote;
      }
      c.has_reg = true;
    }
    return c;
  }

  struct ReqList {
    Request* head = nullptr;
    Request* tail = nullptr;
    int id = 0;
    void push(Request* r) noexcept {
      r->list = id;
      r->next = nullptr;
      r->prev = tail;
      (tail ? tail->next : head) = r;
      tail = r;
    }
    void unlink(Request* r) noexcept {
      (r->prev ? r->prev->next : head) = r->next;
      (r->next ? r->next->prev : tail) = r->prev;
      r->prev = r->next = nullptr;
      r->list = kNone;
    }
  };
  struct Cts {
    int tag;
    std::uint64_t bytes;
    RemoteAddr addr;
    std::uint32_t token;
  };
  struct Unexpected {
    int tag;
    std::vector<unsigned char> data;
  };
  struct Peer {
    // this rank -> peer
    RemoteAddr slots;   // this rank's slots at the peer
    RemoteAddr credit;  // where this rank returns credits at the peer
    unsigned char* staging = nullptr;
    std::vector<std::uint64_t> staging_post;  // per staging slot: 1 + post index of its write
    std::uint64_t sent = 0;                   // notifications posted (next sequence number)
    std::uint64_t posts = 0;                  // backend posts (next post index)
    std::uint64_t completed = 0;              // posts below this index completed
    ReqList outq, rndv_sends, inflight;
    std::deque<Cts> early_cts;
    // peer -> this rank
    unsigned char* inbox = nullptr;
    const std::uint64_t* credit_word = nullptr;  // the peer's consumed count of our messages
    std::uint64_t consumed = 0, returned = 0;
    ReqList eager_recvs;
    std::vector<Request*> tokens;
    std::vector<unsigned char> token_state;  // 0 free, 1 active, 2 retired (cancelled)
    std::vector<std::uint32_t> free_tokens;
    std::deque<Unexpected> unexpected;
  };
  struct CacheEntry {
    Region local, remote;
    bool has_local = false, has_remote = false;
    int refs = 0;
  };
  struct FreeDeleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };

  static std::size_t round_up(std::size_t n) noexcept { return (n + 4095) / 4096 * 4096; }
  static std::uint64_t wr_id(int peer, std::uint64_t post) noexcept {
    return (static_cast<std::uint64_t>(peer) << 40) | (post & ((1ull << 40) - 1));
  }

  std::string op_name(const char* what) const {
    return std::string("one-sided ") + B::name + " " + what;
  }
  std::string op_name(const char* what, int peer) const {
    return detail::concat("one-sided ", B::name, " ", what, " rank ", peer);
  }

  Peer& peer_of(int peer) { return peers_[static_cast<std::size_t>(peer)]; }

  void begin_op(Request& r, int peer, int tag, bool recv, std::size_t bytes, const char* what) {
    if (error_) std::rethrow_exception(error_);
    DTRAIN_REQUIRE(peer >= 0 && peer < size_ && peer != rank_, op_name(what),
                   "peer " << peer << " invalid for rank " << rank_ << " of " << size_);
    DTRAIN_ASSERT(r.st == Request::St::idle || r.st == Request::St::done);
    r.recv = recv;
    r.peer = peer;
    r.tag = tag;
    r.bytes = bytes;
    r.src = nullptr;
    r.dst = nullptr;
    r.temp = false;
    r.act = Request::Act::none;
    r.st = Request::St::queued;
  }

  // Appends to the peer's ordered outbound queue, posting at once when nothing waits before it.
  void enqueue(Peer& P, int peer, Request& r) {
    r.st = Request::St::queued;
    P.outq.push(&r);
    if (P.outq.head == &r) drive(P, peer);
  }

  // Finds the cached registration holding [data, data+bytes) with `access`, registering it for
  // that access on first use; otherwise registers the range for this message only.
  void lookup(Request& r, const void* data, std::size_t bytes, one_sided::Access access) {
    const auto a = reinterpret_cast<std::uintptr_t>(data);
    auto it = cache_.upper_bound(std::make_pair(a, ~std::size_t{0}));
    while (it != cache_.begin()) {
      --it;
      if (it->first.first + it->first.second < a + bytes) continue;
      CacheEntry& e = it->second;
      void* base = reinterpret_cast<void*>(it->first.first);
      if (access == one_sided::Access::local) {
        if (!e.has_local) {
          e.local = backend_.register_memory(base, it->first.second, access);
          e.has_local = true;
        }
        r.reg = e.local;
      } else {
        if (!e.has_remote) {
          e.remote = backend_.register_memory(base, it->first.second, access);
          e.has_remote = true;
        }
        r.reg = e.remote;
      }
      return;
    }
    r.reg = backend_.register_memory(const_cast<void*>(data), bytes, access);
    r.temp = true;
  }
  void drop_temp(Request& r) noexcept {
    if (r.temp) backend_.deregister_memory(r.reg);
    r.temp = false;
  }
  void release(CacheEntry& e) noexcept {
    if (e.has_local) backend_.deregister_memory(e.local);
    if (e.has_remote) backend_.deregister_memory(e.remote);
    e.has_local = e.has_remote = false;
  }

  void check_size(const Request& r, std::uint64_t peer_bytes) {
    if (peer_bytes != r.bytes)
      raise_sticky<TransportError>(
          op_name(r.recv ? "receive from" : "send to", r.peer),
          detail::concat("tag ", r.tag, ": ", r.bytes, " B posted here but ", peer_bytes,
                         " B on the peer"));
  }

  template <class E>
  [[noreturn]] void raise_sticky(const std::string& op, const std::string& what) {
    error_ = std::make_exception_ptr(make_error<E>(op, what));
    std::rethrow_exception(error_);
  }

  bool has_credit(Peer& P) { return P.sent - backend_.load_word(P.credit_word) < slots_; }
  bool signal_now(std::uint64_t post) const noexcept {
    return post % (slots_ / 2) == slots_ / 2 - 1;
  }

  // Posts an eager message or a CTS into the peer's next slot; false when it must wait.
  bool post_slot(Peer& P, int peer, Request& r) {
    if (!has_credit(P)) return false;
    const std::uint64_t k = P.sent;
    const std::size_t s = static_cast<std::size_t>(k % slots_);
    if (P.staging_post[s] > P.completed) return false;  // the slot's last write still reads it
    unsigned char* st = P.staging + s * cfg_.slot_bytes;
    detail::rma::SlotHeader h{};
    h.seq = k;
    h.bytes = r.bytes;
    h.tag = r.tag;
    std::size_t len = sizeof h;
    if (r.act == Request::Act::eager) {
      h.kind = detail::rma::kEager;
      if (r.bytes) std::memcpy(st + sizeof h, r.src, r.bytes);
      len += r.bytes;
    } else {
      h.kind = detail::rma::kCts;
      h.addr = r.reg.addr + (reinterpret_cast<std::uintptr_t>(r.dst) -
                             reinterpret_cast<std::uintptr_t>(r.reg.data));
      h.rkey = r.reg.rkey;
      h.token = r.token;
    }
    std::memcpy(st, &h, sizeof h);
    const std::uint32_t imm = detail::rma::encode_imm(detail::rma::kSlot, k, 0);
    const std::uint64_t post = P.posts;
    if (!backend_.write(peer, st, staging_reg_, len, P.slots.offset(s * cfg_.slot_bytes),
                        wr_id(peer, post), signal_now(post), &imm))
      return false;
    ++P.posts;
    ++P.sent;
    P.staging_post[s] = post + 1;
    return true;
  }

  // Writes a zero-copy send's data straight into the receiver's buffer, notified.
  bool post_data(Peer& P, int peer, Request& r) {
    if (!has_credit(P)) return false;
    const std::uint32_t imm = detail::rma::encode_imm(detail::rma::kData, P.sent, r.token);
    const std::uint64_t post = P.posts;
    if (!backend_.write(peer, r.src, r.reg, r.bytes, r.remote, wr_id(peer, post), true, &imm))
      return false;
    ++P.posts;
    ++P.sent;
    r.post = post;
    return true;
  }

  void drive(Peer& P, int peer) {
    while (Request* r = P.outq.head) {
      const bool ok =
          r->act == Request::Act::data ? post_data(P, peer, *r) : post_slot(P, peer, *r);
      if (!ok) return;
      P.outq.unlink(r);
      if (r->act == Request::Act::data) {
        r->st = Request::St::inflight;  // completes with its local write completion
        P.inflight.push(r);
      } else if (r->act == Request::Act::eager) {
        r->st = Request::St::done;
      } else {
        r->st = Request::St::waiting;  // zero-copy receive: its token waits for the data
      }
      r->act = Request::Act::none;
    }
  }

  void accept_cts(Peer& P, int peer, Request& r, const Cts& c) {
    check_size(r, c.bytes);
    r.remote = c.addr;
    r.token = c.token;
    r.act = Request::Act::data;
    enqueue(P, peer, r);
  }

  void return_credits(Peer& P, int peer) {
    if (P.consumed - P.returned < std::max<std::size_t>(1, slots_ / 2)) return;
    const std::uint64_t post = P.posts;
    if (!backend_.write_word(peer, P.consumed, P.credit, wr_id(peer, post), signal_now(post)))
      return;
    ++P.posts;
    P.returned = P.consumed;
  }

  void on_failure(const Event& e) {
    raise_sticky<TransportError>(op_name("write to", e.peer),
                                 detail::concat(e.status, " (status ", e.code, e.qp ? ", QP " : "",
                                                e.qp ? std::to_string(e.qp) : "",
                                                *e.opcode ? ", opcode " : "", e.opcode, ")"));
  }

  void on_notify(int peer, std::uint32_t imm) {
    using namespace detail::rma;
    using detail::concat;
    Peer& P = peer_of(peer);
    const std::uint64_t k = P.consumed;
    const std::uint32_t got = (imm >> 16) & 0x3fffu, kind = imm >> 30;
    if (got != (k & 0x3fffu))
      raise_sticky<TransportError>(
          op_name("receive from", peer),
          concat("notification out of sequence: expected #", k & 0x3fffu, " (mod 2^14), got #", got,
                 ": a notification was lost, duplicated or is stale"));
    if (kind == kSlot) {
      const unsigned char* slot = P.inbox + static_cast<std::size_t>(k % slots_) * cfg_.slot_bytes;
      SlotHeader h;
      std::memcpy(&h, slot, sizeof h);
      if (h.seq != k)
        raise_sticky<TransportError>(op_name("receive from", peer),
                                     concat("slot ", k % slots_, " holds message #", h.seq,
                                            " where #", k, " was notified (stale slot)"));
      if (h.kind == kEager) {
        on_eager(P, h, slot + sizeof h);
      } else if (h.kind == kCts) {
        on_cts(P, peer, Cts{h.tag, h.bytes, RemoteAddr{h.addr, h.rkey}, h.token});
      } else {
        raise_sticky<TransportError>(op_name("receive from", peer),
                                     concat("slot message #", k, " has unknown kind ", h.kind));
      }
    } else if (kind == kData) {
      const std::uint32_t t = imm & 0xffffu;
      if (t >= P.tokens.size() || P.token_state[t] == 0)
        raise_sticky<TransportError>(op_name("receive from", peer),
                                     concat("data notification #", k, " names receive ", t,
                                            ", which is not waiting (stale notification)"));
      if (Request* r = P.tokens[t]) {
        drop_temp(*r);
        r->st = Request::St::done;
      }
      P.tokens[t] = nullptr;
      if (P.token_state[t] == 1) {
        P.token_state[t] = 0;
        P.free_tokens.push_back(t);
      }
    } else {
      raise_sticky<TransportError>(op_name("receive from", peer),
                                   concat("notification #", k, " has unknown kind ", kind));
    }
    ++P.consumed;
  }

  void on_eager(Peer& P, const detail::rma::SlotHeader& h, const unsigned char* payload) {
    for (Request* r = P.eager_recvs.head; r; r = r->next)
      if (r->tag == h.tag) {
        check_size(*r, h.bytes);
        if (h.bytes) std::memcpy(r->dst, payload, h.bytes);
        P.eager_recvs.unlink(r);
        r->st = Request::St::done;
        return;
      }
    DTRAIN_ASSERT(h.bytes <= eager_limit_);
    std::vector<unsigned char> keep;
    if (!pool_.empty()) {
      keep = std::move(pool_.back());
      pool_.pop_back();
    }
    keep.assign(payload, payload + h.bytes);
    P.unexpected.push_back(Unexpected{h.tag, std::move(keep)});
  }

  void on_cts(Peer& P, int peer, const Cts& c) {
    for (Request* r = P.rndv_sends.head; r; r = r->next)
      if (r->tag == c.tag) {
        P.rndv_sends.unlink(r);
        accept_cts(P, peer, *r, c);
        return;
      }
    P.early_cts.push_back(c);
  }

  void progress() {
    if (error_) std::rethrow_exception(error_);
    Event ev[32];
    int n = 0;
    do {
      n = backend_.poll(ev, 32);
      for (int i = 0; i < n; ++i) {
        const Event& e = ev[i];
        switch (e.kind) {
          case Event::write_done: {
            Peer& P = peer_of(e.peer);
            P.completed = std::max<std::uint64_t>(P.completed, (e.wr_id & ((1ull << 40) - 1)) + 1);
            break;
          }
          case Event::notified: on_notify(e.peer, e.imm); break;
          case Event::failed: on_failure(e);
        }
      }
    } while (n == 32);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      Peer& P = peer_of(q);
      while (Request* r = P.inflight.head) {
        if (r->post >= P.completed) break;
        P.inflight.unlink(r);
        drop_temp(*r);
        r->st = Request::St::done;
      }
      return_credits(P, q);
      if (P.outq.head) drive(P, q);
    }
  }

  // A backend that may leave this rank's memory exposed after a failing close: bool
  // keeps_memory() and static void keep(void*) noexcept (see ~OneSidedTransport).
  template <class BB>
  using keeps_memory_call = decltype(std::declval<const BB&>().keeps_memory());
  template <class BB>
  using has_keeps_memory = detail::is_detected<keeps_memory_call, BB>;

  UnwindGuard unwind_;  // first member: counts the exceptions in flight at construction
  B backend_;
  OneSidedConfig cfg_;
  int size_ = 1, rank_ = 0;
  std::size_t slots_ = 16;  // cfg_.slots: slots (credits) per peer
  std::size_t eager_limit_ = 0;
  std::size_t abandoned_ = 0;  // see cancel()
  bool cancelled_ = false;     // an active request was abandoned: close as failing
  std::unique_ptr<unsigned char, FreeDeleter> inbox_mem_, staging_mem_, credit_mem_;
  Region inbox_reg_, staging_reg_, credit_reg_;
  std::vector<Peer> peers_;
  std::map<std::pair<std::uintptr_t, std::size_t>, CacheEntry> cache_;
  std::vector<std::vector<unsigned char>> pool_;
  std::exception_ptr error_;
};

}  // namespace dtrain
