// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the pieces of multi-level checkpoints (CheckpointLevelOptions): which node each rank is
// on, moving one checkpoint file between two ranks (the partner copy, and rebuilding a lost
// node's copy at restore), and the background copy of a node-local file to the shared level.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

// ---- nodes -----------------------------------------------------------------------------------

/// comm.transport().node_map().node_of(rank) exists (MpiTransport, LoopbackTransport): the
/// communicator's own grouping of ranks into nodes, detected, not included.
template <class Comm, class = void>
struct ckpt_comm_node_map : std::false_type {};
template <class Comm>
struct ckpt_comm_node_map<
    Comm, std::void_t<decltype(int(std::declval<Comm&>().transport().node_map().node_of(0)))>>
    : std::true_type {};

/// This rank's node label: `configured` when >= 0, else the communicator's grouping; -1 when
/// neither is known. Local.
template <class Comm>
int ckpt_node_label(Comm& comm, int configured) {
  if (configured >= 0) return configured;
  if constexpr (ckpt_comm_node_map<Comm>::value)
    return comm.transport().node_map().node_of(comm.rank());
  else
    return -1;
}

/// The node of every rank, nodes numbered in the order of their lowest rank (so node 0 holds
/// rank 0), and each node's leader (its lowest rank). Plain value type.
struct CkptNodes {
  std::vector<int> node_of;  // rank -> node
  std::vector<int> leader;   // node -> lowest rank
  int nodes() const noexcept { return static_cast<int>(leader.size()); }
  /// The node that holds node n's partner copies: the next one.
  int partner(int n) const noexcept { return (n + 1) % nodes(); }
  bool is_leader(int rank) const {
    return leader[static_cast<std::size_t>(node_of[static_cast<std::size_t>(rank)])] == rank;
  }
};

/// Collective (one allreduce of p integers): every rank's label on every rank, renumbered.
template <class Comm>
CkptNodes ckpt_node_layout(Comm& comm, int label) {
  const int p = comm.size();
  std::vector<std::int64_t> labels(static_cast<std::size_t>(p), 0);
  labels[static_cast<std::size_t>(comm.rank())] = label;
  if (p > 1) comm.allreduce(BufferView(labels.data(), labels.size(), DType::i64), ReduceOp::sum);
  CkptNodes n;
  std::vector<std::int64_t> seen;
  for (int r = 0; r < p; ++r) {
    const auto it = std::find(seen.begin(), seen.end(), labels[static_cast<std::size_t>(r)]);
    n.node_of.push_back(static_cast<int>(it - seen.begin()));
    if (it == seen.end()) {
      seen.push_back(labels[static_cast<std::size_t>(r)]);
      n.leader.push_back(r);
    }
  }
  return n;
}

// ---- moving a file between two ranks -----------------------------------------------------------

/// comm.transport() offers two-sided messages with a deadline (every dtrain transport does).
template <class Comm, class = void>
struct ckpt_comm_p2p : std::false_type {};
template <class Comm>
struct ckpt_comm_p2p<Comm,
                     std::void_t<typename std::remove_reference_t<
                                     decltype(std::declval<Comm&>().transport())>::Request,
                                 decltype(std::declval<Comm&>().transport().isend(
                                     std::declval<typename std::remove_reference_t<
                                         decltype(std::declval<Comm&>().transport())>::Request&>(),
                                     0, 0, static_cast<const void*>(nullptr), std::size_t{})),
                                 decltype(std::declval<Comm&>().transport().irecv(
                                     std::declval<typename std::remove_reference_t<
                                         decltype(std::declval<Comm&>().transport())>::Request&>(),
                                     0, 0, static_cast<void*>(nullptr), std::size_t{})),
                                 decltype(bool(std::declval<Comm&>().transport().wait_until(
                                     std::declval<typename std::remove_reference_t<
                                         decltype(std::declval<Comm&>().transport())>::Request&>(),
                                     std::declval<const Deadline&>())))>> : std::true_type {};

/// The tag of checkpoint file transfers. Messages of one (sender, receiver, tag) match in the
/// order they were posted, and both ends post the same number of messages, so a collective's
/// message with the same tag posted after the transfer cannot be taken for part of it.
constexpr int kCkptFileTag = 32765;
/// Bytes per message of a file transfer (a multiple of 8: the broadcast fallback moves words).
constexpr std::size_t kCkptChunk = std::size_t(8) << 20;

/// One file from rank `src` to rank `dst`: over the transport's messages where the communicator
/// exposes them (only the two ranks take part), else by broadcasts from `src` (every rank takes
/// part). Every wait has the one deadline of the transfer.
template <class Comm>
class CkptPipe {
 public:
  CkptPipe(Comm& comm, int src, int dst, double timeout_s, std::string what)
      : comm_(comm),
        src_(src),
        dst_(dst),
        timeout_s_(timeout_s),
        deadline_(Deadline::polled(timeout_s)),
        what_(std::move(what)) {}
  /// Whether this rank has anything to do in the transfer.
  bool involved() const {
    return !ckpt_comm_p2p<Comm>::value || comm_.rank() == src_ || comm_.rank() == dst_;
  }
  /// On src: sends n bytes (n <= kCkptChunk). In the broadcast fallback `buf` must have room for
  /// n rounded up to 8 bytes.
  void send(void* buf, std::size_t n) { move(buf, n, true); }
  /// On dst (and, in the broadcast fallback, on every other rank): receives n bytes.
  void recv(void* buf, std::size_t n) { move(buf, n, false); }

 private:
  void move(void* buf, std::size_t n, bool sending) {
    if constexpr (ckpt_comm_p2p<Comm>::value) {
      auto& t = comm_.transport();
      typename std::remove_reference_t<decltype(t)>::Request r;
      const int peer = sending ? dst_ : src_;
      if (sending)
        t.isend(r, peer, kCkptFileTag, buf, n);
      else
        t.irecv(r, peer, kCkptFileTag, buf, n);
      if (!t.wait_until(r, deadline_)) {
        t.cancel(r);
        raise<TimeoutError>(what_, concat(sending ? "send of " : "receive of ", n, " B ",
                                          sending ? "to rank " : "from rank ", peer,
                                          " timed out after ", timeout_s_, " s"));
      }
    } else {
      (void)sending;
      const std::size_t words = (n + 7) / 8;
      if (words) comm_.broadcast(BufferView(buf, words, DType::i64), src_);
    }
  }

  Comm& comm_;
  int src_, dst_;
  double timeout_s_;
  Deadline deadline_;
  std::string what_;
};

/// An open file descriptor, closed by the destructor.
struct CkptFd {
  int fd = -1;
  CkptFd() = default;
  explicit CkptFd(int f) : fd(f) {}
  CkptFd(CkptFd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  CkptFd& operator=(CkptFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~CkptFd() { reset(); }
  void reset() noexcept {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

inline CkptFd ckpt_open(const std::string& path, int flags, const char* op) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) raise<IoError>(op, "open " + path + ": " + errno_text(errno));
  return CkptFd(fd);
}

inline std::uint64_t ckpt_file_size(int fd, const std::string& path, const char* op) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) raise<IoError>(op, "stat " + path + ": " + errno_text(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

/// Reads exactly n bytes at `offset`; IoError naming the file otherwise.
inline void ckpt_pread_all(int fd, void* buf, std::size_t n, std::uint64_t offset,
                           const std::string& path, const char* op) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) raise<IoError>(op, "read " + path + ": " + errno_text(errno));
    if (got == 0) raise<IoError>(op, "read " + path + ": the file ended early");
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

inline void ckpt_write_all(int fd, const void* buf, std::size_t n, const std::string& path,
                           const char* op) {
  const auto* p = static_cast<const unsigned char*>(buf);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) raise<IoError>(op, "write " + path + ": " + errno_text(errno));
    p += put;
    n -= static_cast<std::size_t>(put);
  }
}

inline void ckpt_fsync_close(CkptFd& f, const std::string& path, const char* op) {
  int rc;
  do {
    rc = ::fsync(f.fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) raise<IoError>(op, "fsync " + path + ": " + errno_text(errno));
  const int fd = std::exchange(f.fd, -1);
  if (::close(fd) != 0) raise<IoError>(op, "close " + path + ": " + errno_text(errno));
}

/// Test knob: called on the receiving rank of a file transfer after each chunk it wrote into the
/// temporary (bytes so far, total), so that a test can stop a writer in the middle. Must not
/// throw. Set before the save, clear after.
inline std::function<void(std::uint64_t, std::uint64_t)>& ckpt_transfer_hook() {
  static std::function<void(std::uint64_t, std::uint64_t)> hook;
  return hook;
}

/// Collective in the broadcast fallback, else only `src` and `dst` do anything. Moves the file
/// `src_path` of rank src to rank dst, which writes it as `to` says (a temporary, fsync, rename,
/// fsync of the directory, keep-last) and checks the whole-file CRC32C the sender computed on
/// the bytes it read. Both ends go through the same messages whatever fails (a source that
/// cannot open the file sends a header saying so; a read or write error mid-way is carried to
/// the end), so the transfer never leaves a message unmatched. Returns this rank's error, if
/// any; a transfer that did not complete leaves no file under `to.final_path`.
template <class Comm>
std::exception_ptr ckpt_transfer_file(Comm& comm, int src, int dst, const std::string& src_path,
                                      const CkptTarget& to, double timeout_s, const char* op) {
  const int rank = comm.rank();
  CkptPipe<Comm> pipe(comm, src, dst, timeout_s, op);
  if (src == dst || !pipe.involved()) return nullptr;
  std::exception_ptr err;
  std::vector<unsigned char> buf;
  try {
    std::int64_t head[2] = {-1, 0};  // file size (-1: the source has no valid file), unused
    std::int64_t tail[2] = {0, 0};   // crc32c, ok
    CkptFd in, out;
    if (rank == src) {
      try {
        in = ckpt_open(src_path, O_RDONLY, op);
        head[0] = static_cast<std::int64_t>(ckpt_file_size(in.fd, src_path, op));
      } catch (...) {
        err = std::current_exception();
      }
      pipe.send(head, sizeof head);
    } else {
      pipe.recv(head, sizeof head);
    }
    if (head[0] < 0) {
      if (rank == dst) raise<IoError>(op, concat("rank ", src, " has no readable copy"));
      return err;
    }
    const auto total = static_cast<std::uint64_t>(head[0]);
    buf.resize(std::min<std::uint64_t>(total, kCkptChunk) + 8);
    std::uint32_t crc = 0;
    bool ok = true;
    if (rank == dst) {
      try {
        out = ckpt_open(to.tmp_path, O_WRONLY | O_CREAT | O_TRUNC, op);
      } catch (...) {
        err = std::current_exception();
        ok = false;
      }
    }
    for (std::uint64_t at = 0; at < total; at += kCkptChunk) {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(kCkptChunk, total - at));
      if (rank == src) {
        if (ok) {
          try {
            ckpt_pread_all(in.fd, buf.data(), n, at, src_path, op);
            crc = crc32c(buf.data(), n, crc);
          } catch (...) {
            err = std::current_exception();
            ok = false;
          }
        }
        if (!ok) std::memset(buf.data(), 0, n);
        pipe.send(buf.data(), n);
      } else {
        pipe.recv(buf.data(), n);
        if (rank == dst && ok) {
          try {
            crc = crc32c(buf.data(), n, crc);
            ckpt_write_all(out.fd, buf.data(), n, to.tmp_path, op);
            if (const auto& hook = ckpt_transfer_hook()) hook(at + n, total);
          } catch (...) {
            err = std::current_exception();
            ok = false;
          }
        }
      }
    }
    if (rank == src) {
      tail[0] = crc;
      tail[1] = ok ? 1 : 0;
      pipe.send(tail, sizeof tail);
      return err;
    }
    pipe.recv(tail, sizeof tail);
    if (rank != dst) return nullptr;
    if (err) std::rethrow_exception(err);
    if (tail[1] != 1) raise<IoError>(op, concat("rank ", src, " failed to read ", src_path));
    if (static_cast<std::uint32_t>(tail[0]) != crc)
      raise<IoError>(op, concat("the copy of ", src_path, " from rank ", src,
                                " does not match the sender's crc32c"));
    ckpt_fsync_close(out, to.tmp_path, op);
    to.publish();
  } catch (...) {
    if (!err) err = std::current_exception();
  }
  if (err && rank == dst) remove_file_quietly(to.tmp_path);
  return err;
}

// ---- the shared level: a background copy -------------------------------------------------------

/// The newest step flushed to the run directory, as recorded in `path` by the flush (one line);
/// -1 when there is no record. It tells a flush that never completed (its copy is newer than the
/// record) from a checkpoint a rollback deleted (no newer than the record). IoError when the file
/// exists but holds no step.
inline std::int64_t read_flush_record(const std::string& path, const char* op) {
  CkptFd f;
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    raise<IoError>(op, "open " + path + ": " + errno_text(errno));
  }
  f = CkptFd(fd);
  char buf[32] = {};
  const ssize_t n = ::pread(f.fd, buf, sizeof buf - 1, 0);
  char* end = nullptr;
  const long long step = n > 0 ? std::strtoll(buf, &end, 10) : -1;
  if (n <= 0 || end == buf || (*end != '\n' && *end != '\0') || step < 0)
    raise<IoError>(op, path +
                           " does not hold a step number (remove it: it is rewritten by the "
                           "next flush)");
  return step;
}

/// Durably records `step` in `path` (temporary, fsync, rename, fsync of the directory);
/// `step` < 0 removes the record.
inline void write_flush_record(const std::string& path, std::int64_t step, const char* op) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (step < 0) {
    remove_file_quietly(path);
    fsync_path(dir, true, op);
    return;
  }
  const std::string tmp = dir + "/." + path.substr(slash + 1) + ".tmp";
  try {
    CkptFd f = ckpt_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, op);
    const std::string line = std::to_string(step) + "\n";
    ckpt_write_all(f.fd, line.data(), line.size(), tmp, op);
    ckpt_fsync_close(f, tmp, op);
    rename_path(tmp, path, op);
    fsync_path(dir, true, op);
  } catch (...) {
    remove_file_quietly(tmp);
    throw;
  }
}

/// Test knob: called on the flush thread before each chunk it copies to the shared level (step,
/// bytes so far, total). Tests block it to see that a save returns before its flush is done.
/// Must not throw. Set before the save, clear after the flush.
inline std::function<void(std::int64_t, std::uint64_t, std::uint64_t)>& ckpt_flush_hook() {
  static std::function<void(std::int64_t, std::uint64_t, std::uint64_t)> hook;
  return hook;
}

/// Copies node-local checkpoint files to the shared level on a thread of its own, one at a
/// time: a new request replaces one that has not started yet (the shared level gets the newest
/// checkpoint, never a queue that grows behind a slow filesystem). Each copy opens its source
/// when it is requested, so pruning the node-local directory cannot take it away. Errors are
/// kept for take_error(). Thread-safe.
class CkptFlusher {
 public:
  CkptFlusher() = default;
  CkptFlusher(const CkptFlusher&) = delete;
  CkptFlusher& operator=(const CkptFlusher&) = delete;
  /// Waits for the copy in progress and the queued one (errors are logged). Never throws.
  ~CkptFlusher() {
    {
      std::unique_lock<std::mutex> lock(m_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    if (error_) {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        DTRAIN_LOG(error, "checkpoint flush to the shared level failed: " << e.what());
      } catch (...) {
      }
    }
  }

  /// Local, returns at once: copy `src` (node-local, published) to `to` (the shared level), then
  /// record `step` in `record` (write_flush_record) unless it is empty. IoError when `src` cannot
  /// be opened.
  void submit(std::int64_t step, const std::string& src, const CkptTarget& to,
              const std::string& record = {}) {
    Job j;
    j.step = step;
    j.src = src;
    j.to = to;
    j.record = record;
    j.in = ckpt_open(src, O_RDONLY, "checkpoint flush");
    std::unique_lock<std::mutex> lock(m_);
    if (queued_)
      DTRAIN_LOG(info, "checkpoint flush of step "
                           << queued_->step << " to the shared level superseded by step " << step
                           << " before it started");
    queued_ = std::make_unique<Job>(std::move(j));
    if (!thread_.joinable()) thread_ = std::thread([this, r = thread_rank()] { run(r); });
    cv_.notify_all();
  }
  /// Local: whether a copy is running or queued.
  bool busy() const {
    std::lock_guard<std::mutex> lock(m_);
    return running_ || queued_;
  }
  /// Local: waits until no copy is running or queued, at most `timeout_s`; false on timeout.
  bool wait_idle(double timeout_s) {
    std::unique_lock<std::mutex> lock(m_);
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                        [&] { return !running_ && !queued_; });
  }
  /// Local: the first error of a finished copy since the last call, if any.
  std::exception_ptr take_error() {
    std::lock_guard<std::mutex> lock(m_);
    return std::exchange(error_, nullptr);
  }
  /// Local: the step of the last copy that completed, -1 before the first.
  std::int64_t last_flushed() const {
    std::lock_guard<std::mutex> lock(m_);
    return last_flushed_;
  }

 private:
  struct Job {
    std::int64_t step = -1;
    std::string src;
    CkptTarget to;
    std::string record;
    CkptFd in;
  };

  void run(int rank) {
    RankScope scope(rank);
    std::unique_lock<std::mutex> lock(m_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || queued_; });
      if (!queued_) return;  // stopping with nothing left
      std::unique_ptr<Job> job = std::move(queued_);
      running_ = true;
      lock.unlock();
      std::exception_ptr err;
      Timer t;
      try {
        copy(*job);
      } catch (...) {
        err = std::current_exception();
        remove_file_quietly(job->to.tmp_path);
      }
      const double ms = t.millis();
      job.reset();
      lock.lock();
      running_ = false;
      if (err && !error_) error_ = err;
      if (!err) {
        DTRAIN_LOG(debug, "checkpoint flushed to the shared level in " << ms << " ms");
      }
      cv_.notify_all();
    }
  }

  void copy(Job& j) {
    const char* op = "checkpoint flush";
    const std::uint64_t total = ckpt_file_size(j.in.fd, j.src, op);
    CkptFd out = ckpt_open(j.to.tmp_path, O_WRONLY | O_CREAT | O_TRUNC, op);
    std::vector<unsigned char> buf(
        static_cast<std::size_t>(std::min<std::uint64_t>(total, kCkptChunk)));
    for (std::uint64_t at = 0;; at += kCkptChunk) {
      if (const auto& hook = ckpt_flush_hook()) hook(j.step, std::min(at, total), total);
      if (at >= total) break;
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(kCkptChunk, total - at));
      ckpt_pread_all(j.in.fd, buf.data(), n, at, j.src, op);
      ckpt_write_all(out.fd, buf.data(), n, j.to.tmp_path, op);
    }
    ckpt_fsync_close(out, j.to.tmp_path, op);
    j.to.publish();
    if (!j.record.empty()) write_flush_record(j.record, j.step, op);
    std::lock_guard<std::mutex> lock(m_);
    last_flushed_ = j.step;
  }

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::thread thread_;
  std::unique_ptr<Job> queued_;
  bool running_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::int64_t last_flushed_ = -1;
};

}  // namespace dtrain::detail
