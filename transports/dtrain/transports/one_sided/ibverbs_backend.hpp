// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the libibverbs backend of the one-sided protocol: a thin adapter, so the logic it runs
// is the protocol tested over loopback RMA and MPI RMA. One reliable-connected queue pair per
// peer, one completion queue; bootstrap of QP numbers, PSNs, LID/GID over the application's MPI
// communicator (no TCP, no ssh). Notified writes are RDMA_WRITE_WITH_IMM into pre-posted
// zero-length receives; credit returns are 8-byte inline RDMA writes.
//
// Device, port and GID: the first device with an active port, its first active port, and on
// Ethernet (RoCE) the first RoCE v2 GID of that port, unless IbverbsDeviceConfig says otherwise
// (ibverbs_config.hpp; IbverbsTransport reads it from DTRAIN_IB_DEVICE / _PORT / _GID_INDEX).
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <mpi.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/one_sided/backend.hpp>
#include <dtrain/transports/one_sided/ibverbs_config.hpp>

/// Throws dtrain::TransportError naming the operation, the verbs call and errno's message.
#define DTRAIN_CHECK_VERBS(cond, operation)                                                    \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      const int dtrain_verbs_errno_ = errno;                                                   \
      ::dtrain::raise<::dtrain::TransportError>(                                               \
          (operation), std::string(#cond) + " failed: " + std::strerror(dtrain_verbs_errno_)); \
    }                                                                                          \
  } while (0)

namespace dtrain::detail {

/// True when this machine has at least one RDMA device (what the ib tests check first).
inline bool ib_device_present() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list) ibv_free_device_list(list);
  return list && n > 0;
}

/// One rank's verbs backend (interface: one_sided/backend.hpp). Construction is collective over
/// `comm`; never calls MPI_Init. `timeout_s` bounds each collective MPI call of the setup (the
/// communicator's duplication, the exchanges of queue-pair and memory addresses, the barrier
/// before the first write; past it the job is ended, mpi_setup_watchdog) and the closing
/// agreement (past it the close leaves the communicator rather than wait).
class IbverbsBackend {
  using Event = one_sided::Event;
  static constexpr std::uint64_t kImmBit = 1ull << 63;  // wr_id flags, stripped before reporting
  static constexpr std::uint64_t kRecvBit = 1ull << 62;
  static constexpr std::uint64_t kFlushBit = 1ull << 61;
  static constexpr std::uint64_t kFlagMask = kImmBit | kRecvBit | kFlushBit;

 public:
  static constexpr const char* name = "ibverbs";

  /// What the setup's deadline messages name as the setting to change.
  static constexpr const char* kTimeoutOption = "the timeout_s of IbverbsTransport";

  /// Collective over `comm`; opens the device, port and GID `dev` names (reads no environment).
  IbverbsBackend(MPI_Comm comm, const IbverbsDeviceConfig& dev, double timeout_s)
      : dev_(dev), timeout_s_(timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      raise<TransportError>("IbverbsTransport",
                            "MPI is not initialised: the verbs transport bootstraps over MPI");
    if (thread_rank() < 0) MPI_Comm_rank(MPI_COMM_WORLD, &thread_rank());
    {
      const IoWatchdog setup_watch =
          mpi_setup_watchdog(comm, timeout_s_, "IbverbsTransport", kTimeoutOption);
      DTRAIN_CHECK_MPI(MPI_Comm_dup(comm, &comm_), "IbverbsTransport");
    }
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Registered pages must stay with this process if the application forks (before any
    // registration). EINVAL means an earlier registration happened already: not fatal.
    ibv_fork_init();
    try {
      open_device();
    } catch (...) {
      failing_ = true;  // no collective call on the way out
      cleanup();
      throw;
    }
  }
  /// Without an orderly close() first (the transport's construction failed after this backend's,
  /// or an exception unwinds), nothing collective is called.
  ~IbverbsBackend() {
    if (!closed_) failing_ = true;
    cleanup();
  }
  IbverbsBackend(const IbverbsBackend&) = delete;
  IbverbsBackend& operator=(const IbverbsBackend&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool allows_progress_thread() const noexcept { return true; }
  /// "mlx5_0 port 1 (InfiniBand, LID 7)" or "... (Ethernet, GID index 3)".
  const std::string& device_description() const noexcept { return description_; }

  void exchange(const void* mine, std::size_t bytes, void* all) {
    const IoWatchdog setup_watch = mpi_setup_watchdog(
        comm_, timeout_s_, "IbverbsTransport (address exchange)", kTimeoutOption);
    DTRAIN_CHECK_MPI(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all,
                                   static_cast<int>(bytes), MPI_BYTE, comm_),
                     "ibverbs bootstrap");
  }

  /// Creates and connects one RC queue pair per peer. Receive queues hold `notifications` + 1
  /// zero-length receives (the protocol's credits bound notified writes in flight to
  /// `notifications`); send queues 2·notifications + 16 work requests, checked before each post.
  void open(int notifications) {
    const auto p = static_cast<std::size_t>(size_);
    rq_depth_ = static_cast<unsigned>(notifications) + 1;
    sq_depth_ = 2 * static_cast<unsigned>(notifications) + 16;
    cq_ = ibv_create_cq(ctx_, static_cast<int>(p * (rq_depth_ + sq_depth_)), nullptr, nullptr, 0);
    DTRAIN_CHECK_VERBS(cq_ != nullptr, "ibverbs open: ibv_create_cq");
    qps_.assign(p, nullptr);
    send_queues_.assign(p, SendQueue{});
    struct Info {
      std::uint32_t qpn, psn;
      std::uint16_t lid, pad;
      std::uint8_t gid[16];
    };
    std::vector<Info> mine(p), all(p * p);
    for (std::size_t q = 0; q < p; ++q) {
      if (static_cast<int>(q) == rank_) continue;
      ibv_qp_init_attr ia{};
      ia.send_cq = cq_;
      ia.recv_cq = cq_;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = sq_depth_;
      ia.cap.max_recv_wr = rq_depth_;
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      ia.cap.max_inline_data = 64;
      ia.sq_sig_all = 0;  // selective signalling
      qps_[q] = ibv_create_qp(pd_, &ia);
      DTRAIN_CHECK_VERBS(qps_[q] != nullptr, concat("ibverbs open: ibv_create_qp for rank ", q,
                                                    " (", description_, ")"));
      max_inline_ = ia.cap.max_inline_data;
      qp_peer_[qps_[q]->qp_num] = static_cast<int>(q);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = 0;
      a.port_num = port_;
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      check_qp(ibv_modify_qp(qps_[q], &a,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
               "INIT", static_cast<int>(q));
      for (unsigned i = 0; i < rq_depth_; ++i) post_recv(static_cast<int>(q));
      Info& m = mine[q];
      m.qpn = qps_[q]->qp_num;
      m.psn = static_cast<std::uint32_t>((rank_ * 7919u + q * 104729u + 1) & 0xffffffu);
      m.lid = lid_;
      std::memcpy(m.gid, gid_.raw, 16);
    }
    exchange(mine.data(), p * sizeof(Info), all.data());
    for (std::size_t q = 0; q < p; ++q) {
      if (static_cast<int>(q) == rank_) continue;
      const Info& them = all[q * p + static_cast<std::size_t>(rank_)];
      const Info& me = mine[q];
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = mtu_;
      a.dest_qp_num = them.qpn;
      a.rq_psn = them.psn;
      a.max_dest_rd_atomic = 1;
      a.min_rnr_timer = 12;
      a.ah_attr.port_num = port_;
      a.ah_attr.dlid = them.lid;
      if (ethernet_ || gid_index_ >= 0) {
        a.ah_attr.is_global = 1;
        std::memcpy(a.ah_attr.grh.dgid.raw, them.gid, 16);
        a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index_ < 0 ? 0 : gid_index_);
        a.ah_attr.grh.hop_limit = 64;
      }
      check_qp(ibv_modify_qp(qps_[q], &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
               "RTR", static_cast<int>(q));
      ibv_qp_attr s{};
      s.qp_state = IBV_QPS_RTS;
      s.timeout = 14;   // 4.096 us * 2^14 = 67 ms per attempt
      s.retry_cnt = 7;  // finite: 7 transport retries, then IBV_WC_RETRY_EXC_ERR
      s.rnr_retry = 3;  // finite (7 would mean forever); credits make RNR impossible anyway
      s.sq_psn = me.psn;
      s.max_rd_atomic = 1;
      check_qp(ibv_modify_qp(qps_[q], &s,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
               "RTS", static_cast<int>(q));
    }
    // Source of credit words when the device cannot send inline.
    credit_src_.assign(p * 8, 0);
    credit_reg_ =
        register_memory(credit_src_.data(), credit_src_.size() * 8, one_sided::Access::local);
    // Every peer's QP is ready to receive before anyone writes.
    const IoWatchdog setup_watch =
        mpi_setup_watchdog(comm_, timeout_s_, "IbverbsTransport (connection)", kTimeoutOption);
    DTRAIN_CHECK_MPI(MPI_Barrier(comm_), "ibverbs open");
  }

  /// ibv_reg_mr with the least access: none for write sources, local + remote write for
  /// destinations. A failure caused by the locked-memory limit says so and how to raise it.
  one_sided::Region register_memory(void* data, std::size_t bytes, one_sided::Access access) {
    const int flags = access == one_sided::Access::remote_write
                          ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                          : 0;
    ibv_mr* mr = ibv_reg_mr(pd_, data, bytes ? bytes : 1, flags);
    if (!mr) {
      const int e = errno;
      rlimit rl{};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      std::string hint;
      if ((e == ENOMEM || e == EPERM || e == EAGAIN) && rl.rlim_cur != RLIM_INFINITY)
        hint = concat("; the locked-memory limit (RLIMIT_MEMLOCK) is ", rl.rlim_cur,
                      " B, too low for RDMA registrations: raise it with `ulimit -l unlimited` "
                      "or in /etc/security/limits.conf (`* soft memlock unlimited`, `* hard "
                      "memlock unlimited`; under Slurm also PropagateResourceLimits)");
      raise<TransportError>(
          "ibverbs register_memory",
          concat("ibv_reg_mr of ", bytes, " B at ", data, " failed: ", std::strerror(e), hint));
    }
    return one_sided::Region{data,     bytes,    reinterpret_cast<std::uintptr_t>(data),
                             mr->rkey, mr->lkey, mr};
  }
  void deregister_memory(one_sided::Region& g) noexcept {
    if (g.handle) ibv_dereg_mr(static_cast<ibv_mr*>(g.handle));
    g = one_sided::Region{};
  }

  bool write(int peer, const void* src, const one_sided::Region& src_region, std::size_t bytes,
             one_sided::RemoteAddr dst, std::uint64_t wr_id, bool signaled,
             const std::uint32_t* imm) {
    constexpr std::size_t kChunk = std::size_t{1} << 30;
    const std::size_t nwr = bytes == 0 ? 1 : (bytes + kChunk - 1) / kChunk;
    SendQueue& sq = send_queues_[static_cast<std::size_t>(peer)];
    if (sq.posted - sq.completed + nwr > sq_depth_) return false;
    std::vector<ibv_sge>& sges = sge_scratch_;
    std::vector<ibv_send_wr>& wrs = wr_scratch_;
    sges.assign(nwr, ibv_sge{});
    wrs.assign(nwr, ibv_send_wr{});
    for (std::size_t i = 0; i < nwr; ++i) {
      const std::size_t off = i * kChunk, len = std::min(kChunk, bytes - std::min(bytes, off));
      sges[i].addr = reinterpret_cast<std::uintptr_t>(src) + off;
      sges[i].length = static_cast<std::uint32_t>(len);
      sges[i].lkey = static_cast<std::uint32_t>(src_region.lkey);
      ibv_send_wr& w = wrs[i];
      const bool last = i + 1 == nwr;
      w.wr_id = wr_id;
      w.sg_list = len ? &sges[i] : nullptr;
      w.num_sge = len ? 1 : 0;
      w.opcode = last && imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      if (last && imm) {
        w.imm_data = htonl(*imm);
        w.wr_id |= kImmBit;
      }
      w.send_flags = (last && signaled ? IBV_SEND_SIGNALED : 0) |
                     (len && len <= max_inline_ ? IBV_SEND_INLINE : 0);
      w.wr.rdma.remote_addr = dst.addr + off;
      w.wr.rdma.rkey = static_cast<std::uint32_t>(dst.rkey);
      w.next = last ? nullptr : &wrs[i + 1];
    }
    post(peer, wrs.data(), nwr, signaled, wr_id);
    return true;
  }

  bool write_word(int peer, std::uint64_t value, one_sided::RemoteAddr dst, std::uint64_t wr_id,
                  bool signaled) {
    SendQueue& sq = send_queues_[static_cast<std::size_t>(peer)];
    if (sq.posted - sq.completed + 1 > sq_depth_) return false;
    // Inline copies the word at post time; otherwise a per-peer registered word is the source
    // (a later return may overwrite it before the NIC reads it: the count only grows, so the
    // peer then sees a newer, still correct value).
    std::uint64_t& src = credit_src_[static_cast<std::size_t>(peer) * 8];
    src = value;
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(&src), 8,
                static_cast<std::uint32_t>(credit_reg_.lkey)};
    ibv_send_wr w{};
    w.wr_id = wr_id;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (max_inline_ >= 8 ? IBV_SEND_INLINE : 0);
    w.wr.rdma.remote_addr = dst.addr;
    w.wr.rdma.rkey = static_cast<std::uint32_t>(dst.rkey);
    post(peer, &w, 1, signaled, wr_id);
    return true;
  }

  std::uint64_t load_word(const std::uint64_t* word) const noexcept {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
  }

  int poll(Event* out, int max) {
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_, std::min(max, 32), wc);
    if (n < 0) raise<TransportError>("ibverbs poll", "ibv_poll_cq failed");
    int k = 0;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& c = wc[i];
      const auto pit = qp_peer_.find(c.qp_num);
      const int peer = pit == qp_peer_.end() ? -1 : pit->second;
      if (c.status != IBV_WC_SUCCESS) {
        if (failed_) continue;  // flushed after the first error: not a new error
        failed_ = true;
        Event e;
        e.kind = Event::failed;
        e.peer = peer;
        e.wr_id = c.wr_id & ~kFlagMask;
        e.status = ibv_wc_status_str(c.status);
        e.code = static_cast<int>(c.status);
        e.qp = c.qp_num;
        e.opcode = c.wr_id & kRecvBit  ? "RECV (for RDMA_WRITE_WITH_IMM)"
                   : c.wr_id & kImmBit ? "RDMA_WRITE_WITH_IMM"
                                       : "RDMA_WRITE";
        out[k++] = e;
        continue;
      }
      if (c.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        Event e;
        e.kind = Event::notified;
        e.peer = peer;
        e.imm = ntohl(c.imm_data);
        out[k++] = e;
        post_recv(peer);
      } else if (peer >= 0) {
        // A signaled send completion: it and every earlier request on this QP are done.
        SendQueue& sq = send_queues_[static_cast<std::size_t>(peer)];
        const std::uint64_t id = c.wr_id & ~kFlagMask;
        while (!sq.signaled.empty() && sq.signaled.front().first != id) sq.signaled.pop_front();
        if (!sq.signaled.empty()) {
          sq.completed = sq.signaled.front().second;
          sq.signaled.pop_front();
        }
        if (!(c.wr_id & kFlushBit)) {
          Event e;
          e.kind = Event::write_done;
          e.peer = peer;
          e.wr_id = id;
          out[k++] = e;
        }
      }
    }
    return k;
  }

  /// Waits (up to 30 s) until this rank's own writes completed, then agrees with the other ranks
  /// that all of them arrived within timeout_s (mpi_agree_on_close), so no peer writes into
  /// memory about to be deregistered. Without that agreement the close is failing: a late peer's
  /// write then meets deregistered memory, which its device refuses, and the communicator is
  /// left allocated (its free is collective).
  void close(bool failing) noexcept {
    closed_ = true;
    failing_ = failing || failed_;
    if (failing_ || !cq_) return;
    try {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        SendQueue& sq = send_queues_[static_cast<std::size_t>(q)];
        if (sq.posted == sq.completed) continue;
        ibv_send_wr w{};
        w.wr_id = kFlushBit | (static_cast<std::uint64_t>(q) << 40) | ((1ull << 40) - 1);
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = 0;
        w.wr.rdma.rkey = 0;
        post(q, &w, 1, true, w.wr_id & ~kFlagMask);
      }
      const Deadline d(30);
      Event ev[32];
      for (;;) {
        bool busy = false;
        for (int q = 0; q < size_; ++q)
          if (q != rank_ && send_queues_[static_cast<std::size_t>(q)].posted !=
                                send_queues_[static_cast<std::size_t>(q)].completed)
            busy = true;
        if (!busy || failed_ || d.expired()) break;
        poll(ev, 32);
      }
      const CloseAgreement a = mpi_agree_on_close(comm_, timeout_s_);
      if (a != CloseAgreement::agreed) {
        failing_ = true;
        DTRAIN_LOG(warn, "IbverbsTransport close: " << describe(a, timeout_s_)
                                                    << "; keeping the communicator");
      }
    } catch (...) {
    }
  }
  void check_alive() const noexcept {}

 private:
  struct SendQueue {
    std::uint64_t posted = 0, completed = 0;                       // work requests
    std::deque<std::pair<std::uint64_t, std::uint64_t>> signaled;  // (wr_id, posted after it)
  };

  void post(int peer, ibv_send_wr* first, std::size_t nwr, bool signaled, std::uint64_t id) {
    SendQueue& sq = send_queues_[static_cast<std::size_t>(peer)];
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qps_[static_cast<std::size_t>(peer)], first, &bad);
    if (rc)
      raise<TransportError>(concat("one-sided ibverbs write to rank ", peer),
                            concat("ibv_post_send failed: ", std::strerror(rc), " (QP ",
                                   qps_[static_cast<std::size_t>(peer)]->qp_num, ")"));
    sq.posted += nwr;
    if (signaled) sq.signaled.emplace_back(id & ~kFlagMask, sq.posted);
  }

  void post_recv(int peer) {
    ibv_recv_wr w{};
    w.wr_id = kRecvBit | static_cast<std::uint64_t>(peer);
    w.num_sge = 0;  // RDMA_WRITE_WITH_IMM consumes a receive but places no data through it
    ibv_recv_wr* bad = nullptr;
    const int rc = ibv_post_recv(qps_[static_cast<std::size_t>(peer)], &w, &bad);
    if (rc)
      raise<TransportError>(concat("one-sided ibverbs receive from rank ", peer),
                            concat("ibv_post_recv failed: ", std::strerror(rc)));
  }

  void check_qp(int rc, const char* state, int peer) {
    if (rc)
      raise<TransportError>(concat("ibverbs connect to rank ", peer),
                            concat("ibv_modify_qp to ", state, " failed: ", std::strerror(rc), " (",
                                   description_, ")"));
  }

  void open_device() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n == 0) {
      if (list) ibv_free_device_list(list);
      raise<TransportError>("IbverbsTransport",
                            "no RDMA device found (ibv_get_device_list returned none)");
    }
    const char* want = dev_.device.empty() ? nullptr : dev_.device.c_str();
    const long want_port = dev_.port, want_gid = dev_.gid_index;
    const bool have_port = want_port > 0, have_gid = want_gid >= 0;
    std::string seen;
    for (int i = 0; i < n && !ctx_; ++i) {
      const char* dev = ibv_get_device_name(list[i]);
      seen += (seen.empty() ? "" : ", ") + std::string(dev);
      if (want && std::strcmp(want, dev) != 0) continue;
      ibv_context* c = ibv_open_device(list[i]);
      if (!c) continue;
      ibv_device_attr da{};
      if (ibv_query_device(c, &da) != 0) {
        ibv_close_device(c);
        continue;
      }
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        if (have_port && p != want_port) continue;
        ibv_port_attr pa{};
        if (ibv_query_port(c, static_cast<std::uint8_t>(p), &pa) != 0) continue;
        if (pa.state != IBV_PORT_ACTIVE) continue;
        ctx_ = c;
        port_ = static_cast<std::uint8_t>(p);
        lid_ = pa.lid;
        mtu_ = pa.active_mtu;
        ethernet_ = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        device_ = dev;
        gid_table_len_ = pa.gid_tbl_len;
        break;
      }
      if (!ctx_) ibv_close_device(c);
    }
    ibv_free_device_list(list);
    if (!ctx_)
      raise<TransportError>(
          "IbverbsTransport",
          concat("no active port", want ? concat(" on device ", want) : std::string(),
                 have_port ? concat(" numbered ", want_port) : std::string(), " (devices: ", seen,
                 "; IbverbsDeviceConfig or DTRAIN_IB_DEVICE / DTRAIN_IB_PORT choose another)"));
    if (have_gid) {
      gid_index_ = static_cast<int>(want_gid);
    } else if (ethernet_) {
      for (int g = 0; g < gid_table_len_ && gid_index_ < 0; ++g) {
        ibv_gid_entry e{};
        if (ibv_query_gid_ex(ctx_, port_, static_cast<std::uint32_t>(g), &e, 0) == 0 &&
            e.gid_type == IBV_GID_TYPE_ROCE_V2)
          gid_index_ = g;
      }
      if (gid_index_ < 0)
        raise<TransportError>("IbverbsTransport",
                              concat(device_, " port ", int(port_),
                                     " is Ethernet but has no RoCE v2 GID (choose one: "
                                     "IbverbsDeviceConfig::gid_index or "
                                     "DTRAIN_IB_GID_INDEX)"));
    }
    if (gid_index_ >= 0)
      DTRAIN_CHECK_VERBS(ibv_query_gid(ctx_, port_, gid_index_, &gid_) == 0,
                         concat("ibverbs setup: GID index ", gid_index_, " of ", device_));
    description_ =
        ethernet_ ? concat(device_, " port ", int(port_), " (Ethernet, GID index ", gid_index_, ")")
                  : concat(device_, " port ", int(port_), " (InfiniBand, LID ", lid_,
                           gid_index_ >= 0 ? concat(", GID index ", gid_index_) : "", ")");
    pd_ = ibv_alloc_pd(ctx_);
    DTRAIN_CHECK_VERBS(pd_ != nullptr, concat("ibverbs setup: ibv_alloc_pd on ", description_));
  }

  void cleanup() noexcept {
    if (credit_reg_.handle) deregister_memory(credit_reg_);
    for (ibv_qp* q : qps_)
      if (q) ibv_destroy_qp(q);
    qps_.clear();
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
    cq_ = nullptr;
    pd_ = nullptr;
    ctx_ = nullptr;
    int finalized = 0;
    MPI_Finalized(&finalized);
    // MPI_Comm_free is collective: not while failing, when peers may never arrive.
    if (!finalized && !failing_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  IbverbsDeviceConfig dev_;
  double timeout_s_ = 300;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::unordered_map<std::uint32_t, int> qp_peer_;
  std::vector<SendQueue> send_queues_;
  std::vector<ibv_sge> sge_scratch_;
  std::vector<ibv_send_wr> wr_scratch_;
  std::vector<std::uint64_t> credit_src_;
  one_sided::Region credit_reg_;
  std::string device_, description_;
  std::uint8_t port_ = 1;
  std::uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  bool ethernet_ = false, failed_ = false, failing_ = false, closed_ = false;
  int gid_index_ = -1, gid_table_len_ = 0;
  ibv_gid gid_{};
  unsigned rq_depth_ = 0, sq_depth_ = 0;
  std::uint32_t max_inline_ = 0;
};

}  // namespace dtrain::detail
