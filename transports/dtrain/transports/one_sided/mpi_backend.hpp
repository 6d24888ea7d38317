// dtrain: the MPI-3 RMA backend of the one-sided protocol. One dynamic window over a duplicate
// of the user's communicator (MPI_Win_create_dynamic), locked for all ranks once (passive
// target, MPI_MODE_NOCHECK); register_memory attaches ranges peers write into (MPI_Win_attach)
// and publishes their MPI_Get_address; a write is MPI_Put + MPI_Win_flush, and its notification
// an MPI_Accumulate(MPI_REPLACE) of one 64-bit ring entry after that flush, so the entry can
// only be seen after the data. Needs the unified memory model (checked), where a target may read
// its window memory with ordinary (atomic) loads.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/one_sided/backend.hpp>
#include <dtrain/transports/one_sided/flag_ring.hpp>

namespace dtrain::detail {

/// One rank's MPI-RMA backend (interface: one_sided/backend.hpp). Construction is collective
/// over `comm`; never calls MPI_Init.
class MpiRmaBackend {
  using Event = one_sided::Event;

 public:
  static constexpr const char* name = "mpi-rma";

  explicit MpiRmaBackend(MPI_Comm comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      raise<TransportError>("MpiRmaTransport",
                            "MPI is not initialised: call MPI_Init_thread first (or create a "
                            "dtrain::MpiSession in main)");
    if (thread_rank() < 0) MPI_Comm_rank(MPI_COMM_WORLD, &thread_rank());
    DTRAIN_CHECK_MPI(MPI_Comm_dup(comm, &comm_), "MpiRmaTransport");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    thread_multiple_ = level == MPI_THREAD_MULTIPLE;
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
    tx_.assign(static_cast<std::size_t>(size_), 0);
    rx_.assign(static_cast<std::size_t>(size_), 0);
  }
  ~MpiRmaBackend() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || failing_) return;  // no collective calls while failing: leak instead
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

  void exchange(const void* mine, std::size_t bytes, void* all) {
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
    const auto* s = static_cast<const unsigned char*>(src);
    for (std::size_t off = 0; off < bytes;) {
      const int n = static_cast<int>(std::min<std::size_t>(bytes - off, 1u << 30));
      DTRAIN_CHECK_MPI(MPI_Put(s + off, n, MPI_BYTE, peer, static_cast<MPI_Aint>(dst.addr + off), n,
                               MPI_BYTE, win_),
                       concat("one-sided mpi-rma write to rank ", peer));
      off += static_cast<std::size_t>(n);
    }
    if (imm) {
      // The flush completes the data at the target before the entry that announces it is sent.
      if (bytes)
        DTRAIN_CHECK_MPI(MPI_Win_flush(peer, win_),
                         concat("one-sided mpi-rma flush to rank ", peer));
      std::uint64_t& n = tx_[static_cast<std::size_t>(peer)];
      const std::uint64_t entry = rma::ring_entry(n, *imm);
      const MPI_Aint at = ring_addr_[static_cast<std::size_t>(peer)] +
                          static_cast<MPI_Aint>((rank_ * ring_size_ + n % ring_size_) * 8);
      DTRAIN_CHECK_MPI(
          MPI_Accumulate(&entry, 1, MPI_UINT64_T, peer, at, 1, MPI_UINT64_T, MPI_REPLACE, win_),
          concat("one-sided mpi-rma notify rank ", peer));
      ++n;
      DTRAIN_CHECK_MPI(MPI_Win_flush(peer, win_), concat("one-sided mpi-rma flush to rank ", peer));
    } else if (bytes) {
      DTRAIN_CHECK_MPI(MPI_Win_flush(peer, win_), concat("one-sided mpi-rma flush to rank ", peer));
    }
    if (signaled) events_.done(peer, wr_id);
    return true;
  }

  bool write_word(int peer, std::uint64_t value, one_sided::RemoteAddr dst, std::uint64_t wr_id,
                  bool signaled) {
    DTRAIN_CHECK_MPI(MPI_Accumulate(&value, 1, MPI_UINT64_T, peer, static_cast<MPI_Aint>(dst.addr),
                                    1, MPI_UINT64_T, MPI_REPLACE, win_),
                     concat("one-sided mpi-rma credit return to rank ", peer));
    DTRAIN_CHECK_MPI(MPI_Win_flush(peer, win_), concat("one-sided mpi-rma flush to rank ", peer));
    if (signaled) events_.done(peer, wr_id);
    return true;
  }

  std::uint64_t load_word(const std::uint64_t* word) const noexcept {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
  }

  int poll(Event* out, int max) {
    int n = events_.drain(out, max);
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
                             rx_[static_cast<std::size_t>(q)], q, out, n, max);
    return n;
  }

  void close(bool failing) noexcept {
    failing_ = failing;
    if (!failing) MPI_Barrier(comm_);
  }
  void check_alive() const noexcept {}

 private:
  struct FreeDeleter {
    void operator()(std::uint64_t* p) const noexcept { std::free(p); }
  };

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0, size_ = 1;
  bool thread_multiple_ = false, failing_ = false;
  std::unique_ptr<std::uint64_t, FreeDeleter> ring_;
  std::uint64_t ring_size_ = 0;
  std::vector<MPI_Aint> ring_addr_;
  std::vector<std::uint64_t> tx_, rx_;
  rma::EventQueue events_;
  unsigned polls_ = 0;
};

}  // namespace dtrain::detail
