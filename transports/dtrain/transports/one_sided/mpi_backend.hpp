// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the MPI-3 RMA backend of the one-sided protocol. One dynamic window over a duplicate
// of the user's communicator (MPI_Win_create_dynamic), locked for all ranks once (passive
// target, MPI_MODE_NOCHECK); register_memory attaches ranges peers write into (MPI_Win_attach)
// and publishes their MPI_Get_address; a write is MPI_Put + MPI_Win_flush, and its notification
// an MPI_Accumulate(MPI_REPLACE) of one 64-bit ring entry after that flush, so the entry can
// only be seen after the data. Needs the unified memory model (checked), where a target may read
// its window memory with ordinary (atomic) loads.
//
// Why a writer thread: MPI_Win_flush has no deadline, and MPICH completes puts to a dynamic
// window through the target's progress, so a flush to a stopped or hung peer never returns. At
// MPI_THREAD_MULTIPLE every write is therefore queued (one FIFO, so writes to a peer keep their
// order: data, flush, notification, flush) to a thread of this backend that runs the MPI calls
// and reports completions and failures through poll; the protocol's own deadline-bounded waits
// then end with the usual timeout naming the peer. A write stuck in a flush is never waited for
// on the error path: close(true) detaches the thread (it ends once the flush returns, or with
// the process) and the memory it or a late peer may still touch stays allocated
// (keeps_memory()). One thread serves all peers, so a flush stuck on one peer also delays writes
// to the others (the waits that then time out still name what is known of the stopped rank).
// Below MPI_THREAD_MULTIPLE the writes flush on the caller's thread: the deadline cannot be
// enforced there (a warning says so at construction).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/one_sided/backend.hpp>
#include <dtrain/transports/one_sided/flag_ring.hpp>

namespace dtrain::detail {

/// One rank's MPI-RMA backend (interface: one_sided/backend.hpp). Construction is collective
/// over `comm`; never calls MPI_Init. Used by one thread at a time; at MPI_THREAD_MULTIPLE it
/// runs its own writer thread (see the header comment).
class MpiRmaBackend {
  using Event = one_sided::Event;

 public:
  static constexpr const char* name = "mpi-rma";
  /// Writes queued to the writer thread beyond which write() answers "queue full".
  static constexpr std::size_t kQueueDepth = 4096;
  /// How long the idle writer thread polls for the next write before it sleeps.
  static constexpr double kLingerSeconds = 100e-6;

  /// Collective over `comm`. `close_timeout_s` bounds the collective setup here and each
  /// address exchange (exchange(); past it the job is ended, mpi_setup_watchdog), the closing
  /// barrier and, at MPI_THREAD_MULTIPLE, the wait for queued writes to finish in an orderly close;
  /// past it the close is treated as failing (nothing freed that a peer might still write). The
  /// node grouping (node_map) is MPI_COMM_TYPE_SHARED's, cut as DTRAIN_RANKS_PER_NODE says (read
  /// here, strictly, through SharedSegmentConfig::from_env; every rank must see the same value).
  explicit MpiRmaBackend(MPI_Comm comm, double close_timeout_s = 300)
      : MpiRmaBackend(comm, close_timeout_s, SharedSegmentConfig::from_env().ranks_per_node) {}
  /// Collective over `comm`; as above with the node grouping cut as `ranks_per_node` says
  /// (reads no environment).
  MpiRmaBackend(MPI_Comm comm, double close_timeout_s, const RanksPerNode& ranks_per_node)
      : close_timeout_s_(close_timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      raise<TransportError>("MpiRmaTransport",
                            "MPI is not initialised: call MPI_Init_thread first (or create a "
                            "dtrain::MpiSession in main)");
    if (thread_rank() < 0) MPI_Comm_rank(MPI_COMM_WORLD, &thread_rank());
    const IoWatchdog setup_watch = mpi_setup_watchdog(comm, close_timeout_s, "MpiRmaTransport",
                                                      "the close_timeout_s of MpiRmaTransport");
    DTRAIN_CHECK_MPI(MPI_Comm_dup(comm, &comm_), "MpiRmaTransport");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    thread_multiple_ = level == MPI_THREAD_MULTIPLE;
    MpiNodeSurvey survey = mpi_node_survey(comm_, "MpiRmaTransport");
    peers_ = std::move(survey.processes);
    node_map_ = NodeMap::subdivided(survey.labels, ranks_per_node);
    DTRAIN_CHECK_MPI(MPI_Win_create_dynamic(MPI_INFO_NULL, comm_, &win_),
                     "MpiRmaTransport: window");
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    int* model = nullptr;
    int flag = 0;
    MPI_Win_get_attr(win_, MPI_WIN_MODEL, &model, &flag);
    if (!flag || *model != MPI_WIN_UNIFIED)
      raise<TransportError>("MpiRmaTransport",
                            "this MPI offers only the separate RMA memory model; the one-sided "
                            "transport needs MPI_WIN_UNIFIED (use the mpi transport instead)");
    DTRAIN_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MpiRmaTransport: lock_all");
    notifications_sent_.assign(static_cast<std::size_t>(size_), 0);
    notifications_read_.assign(static_cast<std::size_t>(size_), 0);
    if (size_ > 1 && thread_multiple_) {
      writer_ = std::make_shared<Writer>();
      writer_->win = win_;
      writer_->rank = thread_rank();
      thread_ = std::thread([w = writer_] { w->run(); });
    } else if (size_ > 1 && rank_ == 0) {
      DTRAIN_LOG(warn,
                 "MpiRmaTransport: MPI runs below MPI_THREAD_MULTIPLE, so one-sided writes "
                 "flush on the caller's thread and a stopped peer can block them past the "
                 "communicator's deadline (initialise MPI with MPI_THREAD_MULTIPLE)");
    }
  }
  ~MpiRmaBackend() {
    if (thread_.joinable()) close(true);  // close() was not called: never wait for the thread
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || failing_) {
      // No collective calls while failing, and the notification rings stay allocated: a late
      // peer's notification may still land there (MPI applies it whenever this rank progresses).
      keep(ring_.release());
      return;
    }
    if (ring_) MPI_Win_detach(win_, ring_.get());
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
    MPI_Comm_free(&comm_);
  }
  MpiRmaBackend(const MpiRmaBackend&) = delete;
  MpiRmaBackend& operator=(const MpiRmaBackend&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The duplicated communicator.
  MPI_Comm mpi_comm() const noexcept { return comm_; }
  /// A progress thread may call MPI only at MPI_THREAD_MULTIPLE.
  bool allows_progress_thread() const noexcept { return thread_multiple_; }
  /// The node of every rank (the hierarchical all-reduce groups by it). Local accessor.
  const NodeMap& node_map() const noexcept { return node_map_; }
  /// Whether writes run on the writer thread (so that no wait of the protocol blocks in MPI).
  bool asynchronous() const noexcept { return writer_ != nullptr; }
  /// Local, never throws: what Linux reports about `peer`'s process when it runs on this node
  /// (exchanged at construction); PeerState::unknown otherwise.
  PeerStatus peer_status(int peer) const noexcept {
    if (peer < 0 || peer >= size_ || peer == rank_ || peers_.empty()) return {};
    return process_status(peers_[static_cast<std::size_t>(peer)]);
  }
  /// After a failing close: memory registered for remote writes and write sources must stay
  /// allocated, because a late peer's put (applied by MPI at this rank's next progress, whether
  /// or not the range is still attached) or a write stuck on the writer thread may touch it.
  bool keeps_memory() const noexcept { return failing_; }
  /// Local, thread-safe, never throws. Keeps `p` (a malloc'ed block, or null) allocated and
  /// reachable until the process ends (keep_forever), so leak checkers do not report it as lost.
  static void keep(void* p) noexcept { keep_forever(p); }
  /// Local. Writes the writer thread was still executing when a failing close gave up on it.
  std::size_t stuck_writes() const noexcept { return stuck_; }

  /// Collective (the protocol's bootstrap and open), bounded like the construction: past
  /// close_timeout_s each waiting rank names the exchange and the job is ended.
  void exchange(const void* mine, std::size_t bytes, void* all) {
    const IoWatchdog setup_watch =
        mpi_setup_watchdog(comm_, close_timeout_s_, "MpiRmaTransport (address exchange)",
                           "the close_timeout_s of MpiRmaTransport");
    DTRAIN_CHECK_MPI(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all,
                                   static_cast<int>(bytes), MPI_BYTE, comm_),
                     "MpiRmaTransport: bootstrap");
  }

  void open(int notifications) {
    ring_size_ = static_cast<std::uint64_t>(notifications);
    const std::size_t bytes = static_cast<std::size_t>(size_) * ring_size_ * 8;
    ring_.reset(static_cast<std::uint64_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    if (!ring_) raise<TransportError>("MpiRmaTransport", "out of memory for notification rings");
    std::memset(ring_.get(), 0, bytes);
    DTRAIN_CHECK_MPI(MPI_Win_attach(win_, ring_.get(), static_cast<MPI_Aint>(bytes)),
                     "MpiRmaTransport: attach rings");
    MPI_Aint mine = 0;
    MPI_Get_address(ring_.get(), &mine);
    ring_addr_.resize(static_cast<std::size_t>(size_));
    exchange(&mine, sizeof mine, ring_addr_.data());
  }

  one_sided::Region register_memory(void* data, std::size_t bytes, one_sided::Access access) {
    MPI_Aint a = 0;
    MPI_Get_address(data, &a);
    one_sided::Region g{data, bytes, static_cast<std::uint64_t>(a), 0, 0, nullptr};
    if (access == one_sided::Access::remote_write && bytes) {
      DTRAIN_CHECK_MPI(MPI_Win_attach(win_, data, static_cast<MPI_Aint>(bytes)),
                       concat("MpiRmaTransport: attach ", bytes, " B"));
      g.handle = data;
    }
    return g;
  }
  void deregister_memory(one_sided::Region& g) noexcept {
    if (g.handle) MPI_Win_detach(win_, g.handle);
    g = one_sided::Region{};
  }

  bool write(int peer, const void* src, const one_sided::Region&, std::size_t bytes,
             one_sided::RemoteAddr dst, std::uint64_t wr_id, bool signaled,
             const std::uint32_t* imm) {
    Op op;
    op.peer = peer;
    op.src = static_cast<const unsigned char*>(src);
    op.bytes = bytes;
    op.dst = static_cast<MPI_Aint>(dst.addr);
    op.wr_id = wr_id;
    op.signaled = signaled;
    if (imm) {
      const std::uint64_t n = notifications_sent_[static_cast<std::size_t>(peer)];
      op.word = true;
      op.value = rma::ring_entry(n, *imm);
      op.value_at = ring_addr_[static_cast<std::size_t>(peer)] +
                    static_cast<MPI_Aint>((rank_ * ring_size_ + n % ring_size_) * 8);
    }
    if (!submit(op)) return false;
    if (imm) ++notifications_sent_[static_cast<std::size_t>(peer)];
    return true;
  }

  bool write_word(int peer, std::uint64_t value, one_sided::RemoteAddr dst, std::uint64_t wr_id,
                  bool signaled) {
    Op op;
    op.peer = peer;
    op.word = true;
    op.value = value;
    op.value_at = static_cast<MPI_Aint>(dst.addr);
    op.wr_id = wr_id;
    op.signaled = signaled;
    return submit(op);
  }

  std::uint64_t load_word(const std::uint64_t* word) const noexcept {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
  }

  int poll(Event* out, int max) {
    int n = writer_ ? writer_->drain(out, max) : events_.drain(out, max);
    // Lets MPI progress operations that its implementation completes at the target, and orders
    // this process's view of the window (unified model).
    if ((++polls_ & 7u) == 0) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    }
    MPI_Win_sync(win_);
    for (int q = 0; q < size_ && n < max; ++q)
      if (q != rank_)
        n = rma::ring_events(ring_.get() + static_cast<std::size_t>(q) * ring_size_, ring_size_,
                             notifications_read_[static_cast<std::size_t>(q)], q, out, n, max);
    return n;
  }

  /// Orderly (failing false, collective): waits up to close_timeout_s for the queued writes and
  /// then agrees with every rank that all of them arrived in time (mpi_agree_on_close, which says
  /// why a barrier alone is not enough); only then does the destructor free the window
  /// (MPI_Win_free, collective). Past the limit, or without that agreement, it degrades to a
  /// failing close. Failing: no MPI call and no unbounded wait; queued writes are dropped, a
  /// write stuck in MPI is left to the detached writer thread (counted in stuck_writes()).
  void close(bool failing) noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    failing_ = failing || finalized;
    const Deadline limit(close_timeout_s_);
    if (writer_) {
      if (!failing_ && !writer_->finish(limit)) {
        failing_ = true;
        warn("writes still unfinished after ", close_timeout_s_,
             " s; leaving them to a detached thread and keeping the memory");
      }
      if (writer_->stop_now()) {
        ++stuck_;
        note_unfinished_operations(1);
        thread_.detach();
      } else {
        thread_.join();
      }
    }
    if (failing_) return;
    const CloseAgreement a = mpi_agree_on_close(comm_, close_timeout_s_);
    if (a == CloseAgreement::agreed) return;
    failing_ = true;
    warn(describe(a, close_timeout_s_), "; keeping the window and its memory");
  }
  void check_alive() const noexcept {}

 private:
  struct FreeDeleter {
    void operator()(std::uint64_t* p) const noexcept { std::free(p); }
  };

  // One queued write: `bytes` from `src` to `dst` at `peer`, then (word) one 64-bit store of
  // `value` at `value_at` that is issued only once the data is complete at the target.
  struct Op {
    int peer = -1;
    const unsigned char* src = nullptr;
    std::size_t bytes = 0;
    MPI_Aint dst = 0;
    bool word = false;
    std::uint64_t value = 0;
    MPI_Aint value_at = 0;
    std::uint64_t wr_id = 0;
    bool signaled = false;
  };

  // Runs one write's MPI calls; returns the first failing call's code and names it in `call`.
  static int execute(MPI_Win win, const Op& op, const char*& call) noexcept {
    int rc = MPI_SUCCESS;
    for (std::size_t off = 0; off < op.bytes && rc == MPI_SUCCESS;) {
      const int n = static_cast<int>(std::min<std::size_t>(op.bytes - off, 1u << 30));
      call = "MPI_Put";
      rc = MPI_Put(op.src + off, n, MPI_BYTE, op.peer, op.dst + static_cast<MPI_Aint>(off), n,
                   MPI_BYTE, win);
      off += static_cast<std::size_t>(n);
    }
    // The flush completes the data at the target before the word that announces it is sent.
    if (rc == MPI_SUCCESS && op.bytes && op.word) {
      call = "MPI_Win_flush";
      rc = MPI_Win_flush(op.peer, win);
    }
    if (rc == MPI_SUCCESS && op.word) {
      call = "MPI_Accumulate";
      rc = MPI_Accumulate(&op.value, 1, MPI_UINT64_T, op.peer, op.value_at, 1, MPI_UINT64_T,
                          MPI_REPLACE, win);
    }
    if (rc == MPI_SUCCESS && (op.bytes || op.word)) {
      call = "MPI_Win_flush";
      rc = MPI_Win_flush(op.peer, win);
    }
    return rc;
  }

  // The writer thread's state, shared with the thread so that a thread detached by a failing
  // close (stuck in MPI) still owns what it touches.
  struct Writer {
    std::mutex m;
    std::condition_variable work, idle;
    std::deque<Op> queue;
    rma::EventQueue events;
    std::atomic<bool> has_events{false};
    std::atomic<bool> pending{false};  // the queue is not empty (read without the lock)
    std::string error;                 // the failure's text; Event::status points into it
    MPI_Win win = MPI_WIN_NULL;
    int rank = -1;
    bool stop = false, discard = false, busy = false, sleeping = false, failed = false;

    void run() {
      RankScope scope(rank);
      std::unique_lock<std::mutex> lock(m);
      for (;;) {
        if (queue.empty() && !stop) {
          // A collective posts its writes in bursts: polling (yielding) for a moment before
          // sleeping saves the wake-up of a sleeping thread, tens of microseconds per message
          // when the cores are busy.
          lock.unlock();
          const double until = now_seconds() + kLingerSeconds;
          while (!pending.load(std::memory_order_acquire) && now_seconds() < until)
            std::this_thread::yield();
          lock.lock();
        }
        while (queue.empty() && !stop) {
          sleeping = true;
          work.wait(lock);
          sleeping = false;
        }
        if (discard || queue.empty()) break;
        const Op op = queue.front();
        queue.pop_front();
        pending.store(!queue.empty(), std::memory_order_release);
        if (failed) continue;  // after the first failure nothing more is written or reported
        busy = true;
        lock.unlock();
        const char* call = "";
        const int rc = execute(win, op, call);
        lock.lock();
        busy = false;
        if (rc != MPI_SUCCESS) {
          failed = true;
          error = concat(call, ": ", mpi_error_string(rc));
          events.failed(op.peer, op.wr_id, error.c_str(), rc, call);
          has_events.store(true, std::memory_order_release);
        } else if (op.signaled) {
          events.done(op.peer, op.wr_id);
          has_events.store(true, std::memory_order_release);
        }
        if (queue.empty()) idle.notify_all();
      }
      busy = false;
      idle.notify_all();
    }
    // Caller's side: false when the queue is full.
    bool push(const Op& op) {
      std::lock_guard<std::mutex> lock(m);
      if (queue.size() >= kQueueDepth) return false;
      queue.push_back(op);
      pending.store(true, std::memory_order_release);
      if (sleeping) work.notify_one();
      return true;
    }
    int drain(Event* out, int max) {
      if (!has_events.load(std::memory_order_acquire)) return 0;
      std::lock_guard<std::mutex> lock(m);
      const int n = events.drain(out, max);
      if (n < max) has_events.store(false, std::memory_order_release);  // all drained
      return n;
    }
    // Waits (bounded) until every queued write ran; false at the deadline.
    bool finish(const Deadline& limit) {
      std::unique_lock<std::mutex> lock(m);
      while ((busy || !queue.empty()) && !failed) {
        const double left = limit.remaining();
        if (left <= 0) return false;
        idle.wait_for(lock, std::chrono::duration<double>(std::min(left, 0.1)));
      }
      return true;
    }
    // Stops the thread, dropping what is queued; true when it is inside MPI right now.
    bool stop_now() {
      std::lock_guard<std::mutex> lock(m);
      stop = discard = true;
      queue.clear();
      pending.store(false, std::memory_order_release);
      work.notify_one();
      return busy;
    }
  };

  template <class... A>
  static void warn(const A&... parts) noexcept {
    try {
      DTRAIN_LOG(warn, "one-sided mpi-rma close: " << concat(parts...));
    } catch (...) {  // close() never throws
    }
  }

  bool submit(const Op& op) {
    if (writer_) return writer_->push(op);
    const char* call = "";
    const int rc = execute(win_, op, call);
    if (rc != MPI_SUCCESS)
      raise<TransportError>(concat("one-sided mpi-rma write to rank ", op.peer),
                            concat(call, ": ", mpi_error_string(rc)));
    if (op.signaled) events_.done(op.peer, op.wr_id);
    return true;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0, size_ = 1;
  bool thread_multiple_ = false, failing_ = false;
  double close_timeout_s_ = 300;
  std::unique_ptr<std::uint64_t, FreeDeleter> ring_;
  std::uint64_t ring_size_ = 0;
  std::vector<MPI_Aint> ring_addr_;
  std::vector<std::uint64_t> notifications_sent_, notifications_read_;
  std::vector<ProcessId> peers_;  // same-node peers' processes; pid 0 elsewhere
  NodeMap node_map_;
  rma::EventQueue events_;  // synchronous path
  std::shared_ptr<Writer> writer_;
  std::thread thread_;
  std::size_t stuck_ = 0;
  unsigned polls_ = 0;
};

}  // namespace dtrain::detail
