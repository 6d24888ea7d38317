// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the MPI transport, point-to-point messages on a duplicate of any communicator the
// application hands in. Needs dtrain::mpi (links MPI). Never calls MPI_Init itself; MpiSession
// is the opt-in helper for programs that are not MPI applications already.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/transports/mpi_gpu_support.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/io_watchdog.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain {
namespace detail {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}
}  // namespace detail
}  // namespace dtrain

/// Throws dtrain::TransportError naming the operation, the MPI call and MPI's own message.
#define DTRAIN_CHECK_MPI(call, operation)                                                  \
  do {                                                                                     \
    const int dtrain_mpi_rc_ = (call);                                                     \
    if (dtrain_mpi_rc_ != MPI_SUCCESS)                                                     \
      ::dtrain::raise<::dtrain::TransportError>(                                           \
          (operation),                                                                     \
          std::string(#call) + ": " + ::dtrain::detail::mpi_error_string(dtrain_mpi_rc_)); \
  } while (0)

namespace dtrain {

/// Local, never throws. Calls MPI_Finalize, except in a process that is failing (job_failing():
/// an error ended its training) or that gave up communication operations still in progress
/// (unfinished_operations()). MPI_Finalize waits for every rank (with MPICH it blocks for as long
/// as one peer is stopped), so on the error path it is a collective that can wait forever; the
/// process then returns without it, and the process manager ends the rest of the job, reporting
/// this process's exit code. Returns whether MPI was finalised (also true if it already was).
/// Applications that finalise MPI themselves after a dtrain error should call this instead.
inline bool finalize_mpi() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return true;
  if (job_failing()) return false;  // the error that ended training is already reported
  if (const std::size_t n = unfinished_operations()) {
    try {
      detail::write_error_line(detail::format_message(
          detail::thread_rank(), "finalize_mpi",
          detail::concat("not finalising MPI: ", n,
                         " communication operation(s) were given up unfinished after an error, "
                         "and MPI_Finalize would wait for the peer they wait for")));
    } catch (...) {  // out of memory for the message: skip it, never throw from here
    }
    return false;
  }
  MPI_Finalize();
  return true;
}

namespace detail {

/// What the ranks of a communicator know of each other's placement: the node label of every rank
/// (the lowest rank of its MPI_COMM_TYPE_SHARED group) and the processes (pid, start time) of the
/// ranks that run on this node and were running when asked (ProcessId{} for this rank and for
/// ranks elsewhere; timeout messages use them to say which rank is stopped, peer_liveness.hpp).
struct MpiNodeSurvey {
  std::vector<int> labels;
  std::vector<ProcessId> processes;
};

/// Collective over `comm`; `op` names the caller in errors.
inline MpiNodeSurvey mpi_node_survey(MPI_Comm comm, const char* op) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm node = MPI_COMM_NULL;
  DTRAIN_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), op);
  int lowest = rank;
  const int rc = MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  DTRAIN_CHECK_MPI(rc, op);
  const ProcessId self = self_process_id();
  const long long mine[3] = {lowest, self.pid, self.start};
  std::vector<long long> all(3 * static_cast<std::size_t>(size));
  DTRAIN_CHECK_MPI(MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, comm), op);
  MpiNodeSurvey out;
  out.labels.resize(static_cast<std::size_t>(size));
  out.processes.resize(static_cast<std::size_t>(size));
  for (std::size_t q = 0; q < out.labels.size(); ++q) {
    out.labels[q] = static_cast<int>(all[3 * q]);
    // Only a process this rank can see as the same one (same node, same pid namespace).
    const ProcessId id{all[3 * q + 1], all[3 * q + 2]};
    if (out.labels[q] == lowest && static_cast<int>(q) != rank &&
        process_status(id).state == PeerState::running)
      out.processes[q] = id;
  }
  return out;
}

/// The deadline of an MPI transport's construction (a chain of collectives over `comm`: its
/// duplication, the node survey, windows). Those cannot be cancelled, so a rank that never
/// constructs its transport (it failed or stopped before) would leave the others inside them for
/// the rest of the allocation; past `seconds` each waiting rank prints this message and the job
/// is ended (IoWatchdog, <dtrain/core/io_watchdog.hpp>). Local; `op` names the transport,
/// `option` the setting that holds the deadline.
inline IoWatchdog mpi_setup_watchdog(MPI_Comm comm, double seconds, const char* op,
                                     const char* option) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", seconds);
  return IoWatchdog(seconds,
                    rank_prefix(thread_rank()) + op + ": the collective setup over the " +
                        std::to_string(size) + " ranks of its communicator did not finish within " +
                        secs +
                        " s; every rank must construct its transport at the same point, and a rank "
                        "that failed or stopped before it (see its own error) leaves the others "
                        "inside MPI collectives, which cannot be cancelled, so the job is ended "
                        "(deadline: " +
                        option + ")");
}

/// Local, thread-safe, never throws. Keeps `p` (a malloc'ed block, or null) allocated and
/// reachable until the process ends, so leak checkers do not report it as lost: memory MPI may
/// still write after a failing close.
inline void keep_forever(void* p) noexcept {
  if (!p) return;
  static std::mutex m;
  static auto* kept = new std::vector<void*>();  // never freed, on purpose
  std::lock_guard<std::mutex> lock(m);
  try {
    kept->push_back(p);
  } catch (...) {  // out of memory: the block stays allocated, unreferenced
  }
}

/// How an orderly close's agreement (mpi_agree_on_close) ended.
enum class CloseAgreement : unsigned char {
  agreed,        ///< every rank arrived in time: free collective resources now
  mpi_error,     ///< an MPI call failed
  late_peers,    ///< not every rank arrived within the limit (this rank gave up)
  no_answer,     ///< the ranks' votes did not all arrive within the limit
  peer_gave_up,  ///< this rank arrived after another had given up on it
};

inline std::string describe(CloseAgreement a, double seconds) {
  switch (a) {
    case CloseAgreement::late_peers: return concat("not every rank arrived within ", seconds, " s");
    case CloseAgreement::no_answer:
      return concat("the ranks did not agree on the close within ", seconds, " s");
    case CloseAgreement::peer_gave_up:
      return concat(
          "another rank gave up waiting for this one at the close (this rank arrived more than ",
          seconds, " s after it)");
    case CloseAgreement::mpi_error: return "an MPI call of the close failed";
    case CloseAgreement::agreed: break;
  }
  return "every rank arrived in time";
}

// Polls `req` until it completes (true) or `limit` passes (false), giving the core away.
inline bool mpi_test_until(MPI_Request& req, const Deadline& limit) noexcept {
  int done = 0;
  Backoff backoff;
  while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && !limit.expired())
    backoff.pause();
  return done != 0;
}

/// Collective over `comm`, bounded by `seconds` per step, never throws: decides whether the ranks
/// may now free a resource whose release is collective and blocking (MPI_Win_free). A barrier
/// alone is not enough: a rank that arrives after the others' barrier timed out (it was stopped
/// past the limit) finds the barrier complete at once, since every rank posted it, and would then
/// wait forever in MPI_Win_free for ranks that gave up and never call it. So after a
/// non-blocking barrier each rank votes "arrived in time" (1) or "gave up" (0) in a non-blocking
/// MPI_MIN all-reduce: a rank that gave up posts its 0 and returns without waiting for the
/// result; the resource is freed only where the result is 1, i.e. where every rank completed the
/// barrier in time and frees it too. Requests that do not complete stay active (MPI forbids
/// freeing a non-blocking collective's request), and the vote's memory is then kept until the
/// process ends, since MPI writes the result whenever the last vote arrives.
inline CloseAgreement mpi_agree_on_close(MPI_Comm comm, double seconds) noexcept {
  const Deadline limit(seconds);
  MPI_Request barrier = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &barrier) != MPI_SUCCESS) return CloseAgreement::mpi_error;
  const bool arrived = mpi_test_until(barrier, limit);
  int* words = static_cast<int*>(std::malloc(2 * sizeof(int)));  // the vote, the result
  if (!words) return CloseAgreement::mpi_error;
  words[0] = arrived ? 1 : 0;
  words[1] = 0;
  MPI_Request vote = MPI_REQUEST_NULL;
  if (MPI_Iallreduce(words, words + 1, 1, MPI_INT, MPI_MIN, comm, &vote) != MPI_SUCCESS) {
    std::free(words);
    return CloseAgreement::mpi_error;
  }
  if (!arrived) {
    keep_forever(words);
    return CloseAgreement::late_peers;
  }
  if (!mpi_test_until(vote, Deadline(seconds))) {
    keep_forever(words);
    return CloseAgreement::no_answer;
  }
  const bool all = words[1] == 1;
  std::free(words);
  return all ? CloseAgreement::agreed : CloseAgreement::peer_gave_up;
}

}  // namespace detail

/// Initialises MPI for programs that are not MPI applications yet (asks for
/// MPI_THREAD_MULTIPLE by default so the communicator's progress thread can run) and finalises it
/// on destruction if it did the initialisation. Create once, in main, before any transport.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, int required = MPI_THREAD_MULTIPLE) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      DTRAIN_CHECK_MPI(MPI_Init_thread(argc, argv, required, &provided_), "MpiSession");
      owner_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
  }
  /// Finalises MPI (finalize_mpi) if this session initialised it.
  ~MpiSession() {
    if (owner_) finalize_mpi();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  /// The thread level MPI granted.
  int thread_level() const noexcept { return provided_; }

 private:
  bool owner_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

/// Point-to-point transport over MPI. The constructor duplicates `comm` (collective over `comm`),
/// so dtrain's messages never meet the application's; any communicator works, not only
/// MPI_COMM_WORLD. Satisfies is_transport_v. Used by one thread at a time (the owner, or the
/// communicator's progress thread, which is only started when MPI runs at MPI_THREAD_MULTIPLE).
class MpiTransport {
 public:
  /// Handle of one send or receive (its own request, or a started persistent channel's).
  struct Request {
    MPI_Request req = MPI_REQUEST_NULL;
    bool is_recv = false;
    MPI_Request* bound = nullptr;  // the channel's persistent request while started
  };
  /// A persistent channel: MPI_Send_init / MPI_Recv_init, started with MPI_Start.
  struct Channel {
    MPI_Request req = MPI_REQUEST_NULL;
    bool is_recv = false;
  };

  // Capabilities (transport_capabilities reads these): host memory, no registration needed.
  static constexpr bool supports_device_memory = false;
  static constexpr bool requires_registration = false;
  static constexpr bool one_sided = false;
  static constexpr bool thread_safe = true;

  /// Local: whether isend/irecv take buffers of device `space` as they are (a GPU-aware MPI):
  /// mpi_device_buffers' rule (the library's answer, DTRAIN_MPI_GPU_AWARE), logged once. The
  /// collectives' own reductions stay on the host; GradientSync hands device buckets over
  /// through this answer and reduces them on the device.
  DeviceBuffers device_buffers(Space space) const {
    const MpiDeviceChoice c = mpi_device_buffers(space);
    return {c.mode != MpiDeviceBuffers::staged, c.why};
  }

  /// Collective over `comm`. Node-shared segments and the node grouping come from the
  /// environment (SharedSegmentConfig::from_env: DTRAIN_SHM, DTRAIN_SHM_SLOT_BYTES,
  /// DTRAIN_SHM_SLOTS, DTRAIN_RANKS_PER_NODE); every rank must see the same values.
  explicit MpiTransport(MPI_Comm comm) : MpiTransport(comm, SharedSegmentConfig::from_env()) {}
  /// Collective over `comm`, with the given segment configuration (reads no environment).
  MpiTransport(MPI_Comm comm, const SharedSegmentConfig& segments) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      raise<TransportError>("MpiTransport",
                            "MPI is not initialised: call MPI_Init_thread first (or create a "
                            "dtrain::MpiSession in main)");
    // Messages raised on this process name its world rank unless the thread already has one.
    if (detail::thread_rank() < 0) MPI_Comm_rank(MPI_COMM_WORLD, &detail::thread_rank());
    const detail::IoWatchdog setup_watch = detail::mpi_setup_watchdog(
        comm, segments.setup_timeout_s, "MpiTransport", "SharedSegmentConfig::setup_timeout_s");
    DTRAIN_CHECK_MPI(MPI_Comm_dup(comm, &comm_), "MpiTransport");
    // Errors come back as codes so that they turn into dtrain exceptions, not aborts.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    void* ub = nullptr;
    int has_ub = 0;
    if (MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &has_ub) == MPI_SUCCESS && has_ub && ub)
      tag_ub_ = *static_cast<int*>(ub);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    thread_multiple_ = level == MPI_THREAD_MULTIPLE;
    close_timeout_s_ = segments.close_timeout_s;
    setup_shared_segments(segments);
  }
  ~MpiTransport() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // MPI_Win_free and MPI_Comm_free are collective: while an exception unwinds this rank or
    // the job is failing, the peers may never arrive, so the handles are leaked instead.
    if (unwind_.failing()) return;
    if (win_ != MPI_WIN_NULL) {
      // MPI_Win_free waits for every rank of the node's window (node_; a rank alone on its node
      // has no window and takes no part): only after those agreed that they arrived in time
      // (detail::mpi_agree_on_close); otherwise the window and communicators stay, like a
      // failing close's.
      const detail::CloseAgreement a = detail::mpi_agree_on_close(node_, close_timeout_s_);
      if (a != detail::CloseAgreement::agreed) {
        try {
          DTRAIN_LOG(warn, "MpiTransport close: " << detail::describe(a, close_timeout_s_)
                                                  << "; keeping the shared window");
        } catch (...) {  // a destructor never throws
        }
        return;
      }
      MPI_Win_free(&win_);
    }
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    // After an abandoned operation, late messages of peers may still arrive on this
    // communicator; freeing it would let MPI hand its context id to the next MPI_Comm_dup, where
    // they would match the receives of an unrelated collective. It is kept until MPI_Finalize.
    if (comm_ != MPI_COMM_NULL && !cancelled_) MPI_Comm_free(&comm_);
  }

  /// Node-shared segments (an MPI-3 shared-memory window over the ranks of this communicator)
  /// when every rank runs on one node; null otherwise or with DTRAIN_SHM=0. Created by the
  /// constructor (collective); the shm all-reduce loads and stores through it.
  SharedSegments* shared_segments() noexcept {
    return win_ != MPI_WIN_NULL && node_map_.nodes() == 1 ? &segments_ : nullptr;
  }
  /// Segments shared by the ranks of this rank's node (a shared-memory window per node, indexed
  /// by rank within the node); null when the node has one rank, with DTRAIN_SHM=0 or when MPI
  /// could not allocate the window. Local accessor; the hierarchical all-reduce uses it.
  SharedSegments* node_segments() noexcept { return win_ == MPI_WIN_NULL ? nullptr : &segments_; }
  /// The node of every rank: MPI_COMM_TYPE_SHARED groups, cut into blocks of
  /// DTRAIN_RANKS_PER_NODE ranks when set. Local accessor (computed by the constructor).
  const NodeMap& node_map() const noexcept { return node_map_; }
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The duplicated communicator (for the application's own MPI calls next to dtrain's).
  MPI_Comm mpi_comm() const noexcept { return comm_; }

  void isend(Request& r, int peer, int tag, const void* data, std::size_t bytes) {
    check_bytes(bytes, "MPI isend");
    r.is_recv = false;
    DTRAIN_CHECK_MPI(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r.req),
                     "MPI isend");
  }
  void irecv(Request& r, int peer, int tag, void* data, std::size_t bytes) {
    check_bytes(bytes, "MPI irecv");
    r.is_recv = true;
    DTRAIN_CHECK_MPI(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r.req),
                     "MPI irecv");
  }
  bool test(Request& r) {
    MPI_Request* q = r.bound ? r.bound : &r.req;
    if (*q == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Status st;
    DTRAIN_CHECK_MPI(MPI_Test(q, &flag, &st), r.is_recv ? "MPI receive" : "MPI send");
    if (flag) r.bound = nullptr;  // a persistent request stays allocated, now inactive
    return flag != 0;
  }

  /// Binds a persistent send of `bytes` at `offset` in `region` to `peer` (MPI_Send_init; local).
  /// The channel id is the MPI tag (channel_tag(id) beyond this MPI's tag limit).
  Channel bind_send(int peer, int channel_id, const MemoryRegion& region, std::size_t offset,
                    std::size_t bytes) {
    check_bytes(bytes, "MPI bind_send");
    Channel c;
    DTRAIN_CHECK_MPI(
        MPI_Send_init(static_cast<const char*>(region.data) + offset, static_cast<int>(bytes),
                      MPI_BYTE, peer, tag_of(channel_id), comm_, &c.req),
        "MPI bind_send");
    return c;
  }
  /// Binds a persistent receive from `peer` (MPI_Recv_init; local).
  Channel bind_recv(int peer, int channel_id, const MemoryRegion& region, std::size_t offset,
                    std::size_t bytes) {
    check_bytes(bytes, "MPI bind_recv");
    Channel c;
    c.is_recv = true;
    DTRAIN_CHECK_MPI(
        MPI_Recv_init(static_cast<char*>(region.data) + offset, static_cast<int>(bytes), MPI_BYTE,
                      peer, tag_of(channel_id), comm_, &c.req),
        "MPI bind_recv");
    return c;
  }
  /// Starts the channel's operation (MPI_Start); `r` then completes it like any request.
  void start(Request& r, Channel& c) {
    DTRAIN_CHECK_MPI(MPI_Start(&c.req), c.is_recv ? "MPI start receive" : "MPI start send");
    r.bound = &c.req;
    r.is_recv = c.is_recv;
  }
  /// Frees the persistent request (an operation still active after a cancel completes on its
  /// own). Never throws.
  void unbind(Channel& c) noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && c.req != MPI_REQUEST_NULL) MPI_Request_free(&c.req);
    c.req = MPI_REQUEST_NULL;
  }
  /// Lets MPI advance this rank's transfers (MPI_Iprobe, which runs MPI's progress engine): under
  /// MPI's weak progress a peer's send that this rank already received may still need this
  /// rank's MPI library, e.g. to acknowledge a rendezvous, before it completes. The plans call it
  /// while they wait on node-shared counters instead of MPI requests. Local, non-blocking; an
  /// error is left to the next test of a request, which reports it.
  void progress() noexcept {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
  }
  /// Polls MPI_Test with the communication layer's backoff (detail/backoff.hpp: spin, then
  /// yield, then bounded sleeps), so that a long wait (a late rank, the progress thread) does not
  /// steal a core from computation.
  bool wait_until(Request& r, const Deadline& deadline) {
    return detail::poll_until([&] { return test(r); }, deadline);
  }
  /// Abandons an active request (error paths): MPI_Cancel, then up to kCancelSeconds for the
  /// operation to complete (cancelled or finished) so that its buffer may be freed. An operation
  /// still active after that (a send already matched by a stalled peer, a receive whose data
  /// is arriving) is counted in abandoned(): MPI may still read or write its buffer until the
  /// operation ends or the job does, so the caller must keep that buffer allocated (a plan
  /// quarantines its own memory, see PlanContext::cancel_all). Never throws.
  void cancel(Request& r) noexcept {
    const bool persistent = r.bound != nullptr;
    MPI_Request* q = persistent ? r.bound : &r.req;
    r.bound = nullptr;
    if (*q == MPI_REQUEST_NULL) return;
    cancelled_ = true;
    MPI_Cancel(q);
    // Give the cancelled (or meanwhile finished) operation a bounded time to complete, so that
    // in the usual case its buffer is out of MPI's hands before the caller frees it; an operation
    // MPI cannot cancel in that time (a send already matched by a stalled peer) is left to finish
    // on its own.
    const Deadline limit(kCancelSeconds);
    detail::Backoff backoff;
    int flag = 0;
    while (MPI_Test(q, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && !limit.expired())
      backoff.pause();
    if (!flag) ++abandoned_;
    if (!persistent && !flag) MPI_Request_free(q);  // the persistent one is freed by unbind
    if (!persistent) *q = MPI_REQUEST_NULL;
  }
  /// Local. How many operations cancel() had to release while still active (their buffers may
  /// still be read or written by MPI until the job ends).
  std::size_t abandoned() const noexcept { return abandoned_; }
  /// Local, never throws. What Linux reports about the process of `peer` when it runs on this
  /// node (running, stopped, exited; its pid and start time were exchanged by the constructor);
  /// PeerState::unknown for a rank on another node. Timeout messages use it to say who stopped.
  detail::PeerStatus peer_status(int peer) const noexcept {
    if (peer < 0 || peer >= size_ || peer == rank_ || peers_.empty()) return {};
    return detail::process_status(peers_[static_cast<std::size_t>(peer)]);
  }
  /// MPI needs no registration: returns the range unchanged.
  MemoryRegion register_memory(void* data, std::size_t bytes, Space space) {
    return MemoryRegion{data, bytes, space, 0, nullptr};
  }
  void deregister_memory(MemoryRegion&) noexcept {}
  /// A progress thread may call MPI only at MPI_THREAD_MULTIPLE (the application may call MPI
  /// at the same time).
  bool allows_progress_thread() const noexcept { return thread_multiple_; }

 private:
  static constexpr double kCancelSeconds = 0.2;  // per abandoned operation, error paths only

  int tag_of(int channel_id) const noexcept {
    return channel_id < tag_ub_ ? channel_id : channel_tag(channel_id);
  }
  static void check_bytes(std::size_t bytes, const char* op) {
    DTRAIN_REQUIRE(bytes <= static_cast<std::size_t>(INT_MAX), op,
                   "message of " << bytes << " B exceeds the MPI int count limit");
  }

  // The node grouping (MPI_COMM_TYPE_SHARED, labelled by each node's lowest rank, cut into
  // blocks of cfg.ranks_per_node), then one shared window per node with a segment per rank
  // (slots, then counters). The counters are C++ atomics in that memory, so synchronisation
  // needs no MPI calls.
  void setup_shared_segments(const SharedSegmentConfig& cfg) {
    detail::MpiNodeSurvey survey = detail::mpi_node_survey(comm_, "MpiTransport");
    peers_ = std::move(survey.processes);
    node_map_ = NodeMap::subdivided(survey.labels, cfg.ranks_per_node);
    const int node = node_map_.node_of(rank_);
    if (!cfg.enabled || node_map_.nodes() == size_) return;  // no node with two ranks
    DTRAIN_CHECK_MPI(MPI_Comm_split(comm_, node, rank_, &node_), "MpiTransport");
    const int node_size = node_map_.node_size(node);
    if (node_size < 2) {
      MPI_Comm_free(&node_);
      return;
    }
    MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
    void* base = nullptr;
    const std::size_t bytes = cfg.segment_bytes();
    int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 64, MPI_INFO_NULL, node_, &base,
                                     &win_);
    int ok = rc == MPI_SUCCESS ? 1 : 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node_);
    if (!all_ok) {
      if (rc == MPI_SUCCESS) MPI_Win_free(&win_);
      win_ = MPI_WIN_NULL;
      MPI_Comm_free(&node_);
      return;
    }
    SharedSegments::init_flags(static_cast<unsigned char*>(base) + cfg.slots * cfg.slot_bytes,
                               cfg.slots);
    segments_.rank = node_map_.local_rank(rank_);
    segments_.size = node_size;
    segments_.slots = cfg.slots;
    segments_.slot_bytes = cfg.slot_bytes;
    std::vector<unsigned char*> heaps;
    for (int q = 0; q < node_size; ++q) {
      MPI_Aint qbytes = 0;
      int disp = 0;
      void* qbase = nullptr;
      DTRAIN_CHECK_MPI(MPI_Win_shared_query(win_, q, &qbytes, &disp, &qbase), "MpiTransport");
      auto* b = static_cast<unsigned char*>(qbase);
      segments_.data.push_back(b);
      segments_.flags.push_back(
          reinterpret_cast<std::atomic<std::uint64_t>*>(b + cfg.slots * cfg.slot_bytes));
      if (cfg.heap_bytes) heaps.push_back(b + cfg.heap_offset());
    }
    segments_.set_heaps(std::move(heaps), cfg.heap_bytes);
    MPI_Barrier(node_);  // every rank's counters exist before anyone reads them
  }

  UnwindGuard unwind_;  // counts the exceptions in flight at construction
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  SharedSegments segments_;
  NodeMap node_map_;
  std::vector<detail::ProcessId> peers_;  // same-node peers' processes; pid 0 elsewhere
  std::size_t abandoned_ = 0;
  double close_timeout_s_ = 300;  // SharedSegmentConfig::close_timeout_s
  bool cancelled_ = false;        // an active operation was abandoned: comm_ is never freed
  int rank_ = 0;
  int size_ = 1;
  int tag_ub_ = 32767;
  bool thread_multiple_ = false;
};

static_assert(detail::check_transport<MpiTransport>(), "");

}  // namespace dtrain
