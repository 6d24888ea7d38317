// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the loopback RMA backend of the one-sided protocol: ranks are threads of one process,
// a write is a memcpy into the target's registered memory followed by an atomic store into its
// notification ring. Writes are checked against the target's registrations (address, length,
// key, remote-write access) like a NIC checks an rkey, and faults can be injected to test the
// protocol's error paths (see LoopbackRmaFault).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/transports/one_sided/backend.hpp>
#include <dtrain/transports/one_sided/flag_ring.hpp>

namespace dtrain {
namespace detail {
class one_sided_loopback_access;
}

/// A fault the loopback RMA world injects on purpose (tests of the error paths). Counting
/// starts at 1: `after` = 3 hits the third notified write (the third credit return for
/// stop_credits) from `rank` to `peer`.
struct LoopbackRmaFault {
  enum class Kind {
    remote_access_error,  ///< the write is refused as a NIC refuses a bad rkey; the connection
                          ///< between the two ranks breaks (the peer sees its queue flushed)
    flushed_queue,        ///< the connection goes to the error state: both ends' work flushed
    stop_credits,         ///< `rank` stops returning credits to `peer` after `after` returns
    lost_notification     ///< the data is written but its notification never arrives
  };
  Kind kind = Kind::remote_access_error;
  int rank = 0;
  int peer = 1;
  std::uint64_t after = 1;
};

/// The shared state of N loopback RMA ranks (threads). Create one, inject faults if wanted,
/// then one LoopbackRmaTransport per rank on its own thread. Thread-safe; must outlive its
/// transports.
class LoopbackRmaWorld {
 public:
  explicit LoopbackRmaWorld(int size) : size_(size), regs_(static_cast<std::size_t>(size)) {
    DTRAIN_REQUIRE(size >= 1, "LoopbackRmaWorld", "size " << size << " must be at least 1");
    broken_.reset(new std::atomic<int>[static_cast<std::size_t>(size) * size]);
    for (int i = 0; i < size * size; ++i) broken_[i].store(0);
    rings_.resize(static_cast<std::size_t>(size) * size);
  }
  LoopbackRmaWorld(const LoopbackRmaWorld&) = delete;
  LoopbackRmaWorld& operator=(const LoopbackRmaWorld&) = delete;

  int size() const noexcept { return size_; }

  /// Adds a fault; call before the transports are created.
  void inject(const LoopbackRmaFault& f) {
    DTRAIN_REQUIRE(f.rank >= 0 && f.rank < size_ && f.peer >= 0 && f.peer < size_ &&
                       f.rank != f.peer && f.after >= 1,
                   "LoopbackRmaWorld::inject",
                   "fault between ranks " << f.rank << " and " << f.peer << " after " << f.after);
    faults_.push_back(f);
  }

  /// Marks the world failed (a rank's thread threw): every wait then throws RemoteError.
  void abort(int failed_rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load()) return;
    abort_message_ = "rank " + std::to_string(failed_rank) + " failed: " + why;
    aborted_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  std::string abort_message() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return abort_message_;
  }

 private:
  friend class detail::one_sided_loopback_access;
  struct Reg {
    std::uintptr_t addr;
    std::size_t bytes;
    bool remote_write;
  };

  // Generation barrier of the bootstrap; throws RemoteError when a rank failed meanwhile.
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned gen = gen_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    while (gen_ == gen) {
      if (aborted_.load()) raise<RemoteError>("loopback-rma bootstrap", abort_message_);
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
  void exchange(int rank, const void* mine, std::size_t bytes, void* all) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (xbuf_.size() < bytes * size_) xbuf_.resize(bytes * size_);
      std::memcpy(xbuf_.data() + bytes * rank, mine, bytes);
    }
    barrier();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::memcpy(all, xbuf_.data(), bytes * size_);
    }
    barrier();
  }

  int size_;
  std::vector<LoopbackRmaFault> faults_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  unsigned gen_ = 0;
  std::vector<unsigned char> xbuf_;
  std::atomic<bool> aborted_{false};
  std::string abort_message_;
  // Writers into a rank's memory hold it shared from the check of the registration to the end
  // of the copy; deregistration holds it exclusively, so that (as on a NIC, whose deregistration
  // returns only after the accesses in flight) no write lands in memory after its registration
  // is gone and the owner frees it.
  std::shared_mutex reg_m_;
  std::vector<std::map<std::uint64_t, Reg>> regs_;  // per rank: key -> registration
  std::uint64_t next_key_ = 1;
  std::unique_ptr<std::atomic<int>[]> broken_;           // [a * size + b]: 1 = failed
  std::vector<std::unique_ptr<std::uint64_t[]>> rings_;  // [dst * size + src]
  std::uint64_t ring_size_ = 0;
};

namespace detail {

/// The world's internals, for the backend only.
class one_sided_loopback_access {
 public:
  using Reg = LoopbackRmaWorld::Reg;
  static LoopbackRmaWorld::Reg* find(LoopbackRmaWorld& w, int rank, std::uint64_t key) {
    auto& m = w.regs_[static_cast<std::size_t>(rank)];
    auto it = m.find(key);
    return it == m.end() ? nullptr : &it->second;
  }
  static std::shared_mutex& reg_mutex(LoopbackRmaWorld& w) { return w.reg_m_; }
  static std::uint64_t add(LoopbackRmaWorld& w, int rank, const Reg& r) {
    std::unique_lock<std::shared_mutex> lock(w.reg_m_);
    const std::uint64_t key = w.next_key_++;
    w.regs_[static_cast<std::size_t>(rank)].emplace(key, r);
    return key;
  }
  static void remove(LoopbackRmaWorld& w, int rank, std::uint64_t key) noexcept {
    std::unique_lock<std::shared_mutex> lock(w.reg_m_);
    w.regs_[static_cast<std::size_t>(rank)].erase(key);
  }
  static std::atomic<int>& broken(LoopbackRmaWorld& w, int a, int b) noexcept {
    return w.broken_[static_cast<std::size_t>(a) * w.size_ + b];
  }
  static std::uint64_t* ring(LoopbackRmaWorld& w, int dst, int src) noexcept {
    return w.rings_[static_cast<std::size_t>(dst) * w.size_ + src].get();
  }
  static std::uint64_t ring_size(const LoopbackRmaWorld& w) noexcept { return w.ring_size_; }
  static void open(LoopbackRmaWorld& w, int rank, int notifications) {
    {
      std::lock_guard<std::mutex> lock(w.mutex_);
      w.ring_size_ = static_cast<std::uint64_t>(notifications);
      for (int src = 0; src < w.size_; ++src) {
        auto& ring = w.rings_[static_cast<std::size_t>(rank) * w.size_ + src];
        ring.reset(new std::uint64_t[static_cast<std::size_t>(notifications)]());
      }
    }
    w.barrier();
  }
  static void exchange(LoopbackRmaWorld& w, int rank, const void* mine, std::size_t bytes,
                       void* all) {
    w.exchange(rank, mine, bytes, all);
  }
  static void barrier(LoopbackRmaWorld& w) { w.barrier(); }
  static const std::vector<LoopbackRmaFault>& faults(const LoopbackRmaWorld& w) noexcept {
    return w.faults_;
  }
};

/// One rank's loopback RMA backend (see one_sided/backend.hpp for the interface).
class LoopbackRmaBackend {
  using A = one_sided_loopback_access;
  using Event = one_sided::Event;

 public:
  static constexpr const char* name = "loopback-rma";

  LoopbackRmaBackend(LoopbackRmaWorld& world, int rank) : world_(&world), rank_(rank) {
    DTRAIN_REQUIRE(rank >= 0 && rank < world.size(), "LoopbackRmaTransport",
                   "rank " << rank << " outside world of " << world.size());
    const auto n = static_cast<std::size_t>(world.size());
    notifications_sent_.assign(n, 0);
    notifications_read_.assign(n, 0);
    notified_.assign(n, 0);
    credit_stores_.assign(n, 0);
    reported_.assign(n, 0);
  }
  LoopbackRmaBackend(const LoopbackRmaBackend&) = delete;
  LoopbackRmaBackend& operator=(const LoopbackRmaBackend&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_->size(); }
  LoopbackRmaWorld& world() noexcept { return *world_; }
  bool allows_progress_thread() const noexcept { return true; }
  /// Registrations this rank has made so far (tests check that the hot path makes none).
  std::size_t registrations() const noexcept { return registrations_; }

  void exchange(const void* mine, std::size_t bytes, void* all) {
    A::exchange(*world_, rank_, mine, bytes, all);
  }
  void open(int notifications) { A::open(*world_, rank_, notifications); }

  one_sided::Region register_memory(void* data, std::size_t bytes, one_sided::Access access) {
    const auto a = reinterpret_cast<std::uintptr_t>(data);
    ++registrations_;
    const std::uint64_t key =
        A::add(*world_, rank_, A::Reg{a, bytes, access == one_sided::Access::remote_write});
    return one_sided::Region{data, bytes, a, key, key, nullptr};
  }
  void deregister_memory(one_sided::Region& g) noexcept {
    if (g.rkey) A::remove(*world_, rank_, g.rkey);
    g = one_sided::Region{};
  }

  bool write(int peer, const void* src, const one_sided::Region& src_region, std::size_t bytes,
             one_sided::RemoteAddr dst, std::uint64_t wr_id, bool signaled,
             const std::uint32_t* imm) {
    const char* opcode = imm ? "RDMA_WRITE_WITH_IMM" : "RDMA_WRITE";
    if (A::broken(*world_, rank_, peer).load(std::memory_order_acquire)) {
      events_.failed(peer, wr_id, "work request flushed error", 5, opcode);
      return true;
    }
    bool lose = false;
    if (imm) {
      const std::uint64_t n = ++notified_[static_cast<std::size_t>(peer)];
      for (const auto& f : A::faults(*world_)) {
        if (f.rank != rank_ || f.peer != peer || f.after != n) continue;
        if (f.kind == LoopbackRmaFault::Kind::remote_access_error) {
          break_connection(peer);
          events_.failed(peer, wr_id, "remote access error (injected)", 10, opcode);
          return true;
        }
        if (f.kind == LoopbackRmaFault::Kind::flushed_queue) {
          break_connection(peer);
          events_.failed(peer, wr_id,
                         "work request flushed error (injected: connection in error state)", 5,
                         opcode);
          return true;
        }
        if (f.kind == LoopbackRmaFault::Kind::lost_notification) lose = true;
      }
    }
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    const auto sa = reinterpret_cast<std::uintptr_t>(src_region.data);
    if (s < sa || s + bytes > sa + src_region.bytes) {
      events_.failed(peer, wr_id, "local protection error (source outside its registration)", 4,
                     opcode);
      return true;
    }
    if (!store_remote(peer, dst, bytes, wr_id, opcode, [&] {
          if (bytes) std::memcpy(reinterpret_cast<void*>(dst.addr), src, bytes);
        }))
      return true;
    if (imm && !lose) {
      std::uint64_t& n = notifications_sent_[static_cast<std::size_t>(peer)];
      std::uint64_t* ring = A::ring(*world_, peer, rank_);
      __atomic_store_n(&ring[n % A::ring_size(*world_)], detail::rma::ring_entry(n, *imm),
                       __ATOMIC_RELEASE);
      ++n;
    } else if (imm) {
      ++notifications_sent_[static_cast<std::size_t>(peer)];
    }
    if (signaled) events_.done(peer, wr_id);
    return true;
  }

  bool write_word(int peer, std::uint64_t value, one_sided::RemoteAddr dst, std::uint64_t wr_id,
                  bool signaled) {
    if (A::broken(*world_, rank_, peer).load(std::memory_order_acquire)) {
      events_.failed(peer, wr_id, "work request flushed error", 5, "RDMA_WRITE");
      return true;
    }
    const std::uint64_t n = ++credit_stores_[static_cast<std::size_t>(peer)];
    for (const auto& f : A::faults(*world_))
      if (f.kind == LoopbackRmaFault::Kind::stop_credits && f.rank == rank_ && f.peer == peer &&
          n > f.after) {
        if (signaled) events_.done(peer, wr_id);
        return true;  // silently withheld
      }
    if (!store_remote(peer, dst, 8, wr_id, "RDMA_WRITE", [&] {
          __atomic_store_n(reinterpret_cast<std::uint64_t*>(dst.addr), value, __ATOMIC_RELEASE);
        }))
      return true;
    if (signaled) events_.done(peer, wr_id);
    return true;
  }

  std::uint64_t load_word(const std::uint64_t* word) const noexcept {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
  }

  int poll(Event* out, int max) {
    int n = events_.drain(out, max);
    const int p = size();
    for (int q = 0; q < p && n < max; ++q) {
      if (q == rank_) continue;
      if (!reported_[static_cast<std::size_t>(q)] &&
          A::broken(*world_, rank_, q).load(std::memory_order_acquire)) {
        reported_[static_cast<std::size_t>(q)] = 1;
        Event e;
        e.kind = Event::failed;
        e.peer = q;
        e.status = "work request flushed error (the connection went to the error state)";
        e.code = 5;
        e.opcode = "RECV_RDMA_WITH_IMM";
        out[n++] = e;
        continue;
      }
      n = rma::ring_events(A::ring(*world_, rank_, q), A::ring_size(*world_),
                           notifications_read_[static_cast<std::size_t>(q)], q, out, n, max);
    }
    return n;
  }

  void close(bool failing) noexcept {
    if (failing || world_->aborted()) return;
    try {
      A::barrier(*world_);
    } catch (...) {  // another rank failed meanwhile: nothing to wait for
    }
  }

  void check_alive() const {
    if (world_->aborted()) raise<RemoteError>("loopback-rma transport", world_->abort_message());
  }

 private:
  // Runs `store` (which writes [dst, dst + bytes) of `peer`'s memory) when that range lies in a
  // remote-writable registration of `peer`, holding the registry's lock shared throughout, so a
  // deregistration (exclusive) waits for it. Else breaks the connection and fails `wr_id` as a
  // remote access error, and returns false.
  template <class Store>
  bool store_remote(int peer, one_sided::RemoteAddr dst, std::size_t bytes, std::uint64_t wr_id,
                    const char* opcode, Store&& store) {
    {
      std::shared_lock<std::shared_mutex> lock(A::reg_mutex(*world_));
      const A::Reg* g = A::find(*world_, peer, dst.rkey);
      if (g && g->remote_write && dst.addr >= g->addr && dst.addr + bytes <= g->addr + g->bytes) {
        store();
        return true;
      }
    }
    break_connection(peer);
    events_.failed(peer, wr_id, "remote access error", 10, opcode);
    return false;
  }
  void break_connection(int peer) noexcept {
    A::broken(*world_, rank_, peer).store(1, std::memory_order_release);
    A::broken(*world_, peer, rank_).store(1, std::memory_order_release);
    reported_[static_cast<std::size_t>(peer)] = 1;  // this side reports the write's own error
  }
  LoopbackRmaWorld* world_;
  int rank_;
  std::vector<std::uint64_t> notifications_sent_, notifications_read_, notified_, credit_stores_;
  std::vector<unsigned char> reported_;
  rma::EventQueue events_;
  std::size_t registrations_ = 0;
};

}  // namespace detail
}  // namespace dtrain
