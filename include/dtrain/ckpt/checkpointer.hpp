// dtrain: Checkpointer, periodic atomic checkpoints of a training run, restored exactly.
//
// This header has no HDF5 dependency: the file format is a policy, and the default one,
// dtrain::Hdf5Format, lives in <dtrain/ckpt/hdf5.hpp>. Include that header to use Checkpointer
// with its default format.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/core/version.hpp>

namespace dtrain {

struct Hdf5Format;  // <dtrain/ckpt/hdf5.hpp>

/// Who writes what. Per-rank state always ends up in the same file as the replicated state.
enum class CheckpointStrategy : unsigned char {
  automatic,        ///< the measured fastest that the communicator and options allow
  rank0,            ///< per-rank state is gathered to rank 0, which writes the file alone
  parallel_rank0,   ///< MPI-IO file: rank 0 writes replicated tensors, each rank its own state
  parallel_slices,  ///< MPI-IO file: every rank writes a disjoint axis-0 slice of each tensor
};

constexpr const char* name_of(CheckpointStrategy s) noexcept {
  switch (s) {
    case CheckpointStrategy::automatic: return "automatic";
    case CheckpointStrategy::rank0: return "rank0";
    case CheckpointStrategy::parallel_rank0: return "parallel_rank0";
    case CheckpointStrategy::parallel_slices: return "parallel_slices";
  }
  return "?";
}

/// Settings of a Checkpointer. Plain data.
struct CheckpointOptions {
  std::int64_t every_steps = 0;  ///< maybe_save saves when step % every_steps == 0 (0: never)
  double every_seconds = 0;  ///< ... or when this much time passed since the last save (0: never)
  int keep_last = 3;         ///< valid checkpoints kept in the run directory (>= 1)
  bool async = false;        ///< write from a host snapshot on a background thread
  std::string config;        ///< stored verbatim in every file (e.g. the run's configuration)
  CheckpointStrategy strategy = CheckpointStrategy::automatic;
  std::string prefix = "ckpt";  ///< files are <prefix>-<step, 12 digits>.h5
  /// Restoring on a different number of ranks always restores replicated state; per-rank
  /// objects are then an error unless this is set, in which case they keep their current state.
  bool reset_per_rank_on_resize = false;
  /// Deadline for waiting on a background write.
  double wait_timeout_seconds = 3600;
};

namespace detail {

// ---- collectives over the communicator contract: broadcast(BufferView, root), allreduce ----

template <class Comm>
void ckpt_bcast_i64(Comm& comm, std::vector<std::int64_t>& v, int root) {
  if (!v.empty()) comm.broadcast(BufferView(v.data(), v.size(), DType::i64), root);
}

template <class Comm>
std::int64_t ckpt_allreduce_i64(Comm& comm, std::int64_t x, ReduceOp op) {
  comm.allreduce(BufferView(&x, 1, DType::i64), op);
  return x;
}

/// Broadcasts a byte string of any length from `root` (length first, then 8-byte words).
template <class Comm>
void ckpt_bcast_bytes(Comm& comm, std::vector<unsigned char>& bytes, int root) {
  std::vector<std::int64_t> n{static_cast<std::int64_t>(bytes.size())};
  ckpt_bcast_i64(comm, n, root);
  const std::size_t len = static_cast<std::size_t>(n[0]);
  const std::size_t words = (len + 7) / 8;
  bytes.resize(words * 8);
  if (words) comm.broadcast(BufferView(bytes.data(), words, DType::i64), root);
  bytes.resize(len);
}

template <class Comm>
void ckpt_bcast_string(Comm& comm, std::string& s, int root) {
  std::vector<unsigned char> b(s.begin(), s.end());
  ckpt_bcast_bytes(comm, b, root);
  s.assign(b.begin(), b.end());
}

enum class ErrCode : std::int64_t {
  error = 0,
  invalid_argument = 1,
  io = 2,
  timeout = 3,
  remote = 4
};

inline std::pair<ErrCode, std::string> classify(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const InvalidArgument& x) {
    return {ErrCode::invalid_argument, x.what()};
  } catch (const IoError& x) {
    return {ErrCode::io, x.what()};
  } catch (const TimeoutError& x) {
    return {ErrCode::timeout, x.what()};
  } catch (const RemoteError& x) {
    return {ErrCode::remote, x.what()};
  } catch (const std::exception& x) {
    return {ErrCode::error, x.what()};
  } catch (...) {
    return {ErrCode::error, "unknown exception"};
  }
}

/// Collective: every rank learns whether any rank failed. The lowest failing rank rethrows its
/// own exception; the others throw the same type for bad arguments (everyone's problem) and
/// RemoteError otherwise, quoting the failing rank's message.
template <class Comm>
void ckpt_agree(Comm& comm, const std::exception_ptr& local, const char* operation) {
  const std::int64_t none = std::numeric_limits<std::int64_t>::max();
  const std::int64_t me = local ? comm.rank() : none;
  const std::int64_t first = ckpt_allreduce_i64(comm, me, ReduceOp::min);
  if (first == none) return;
  std::pair<ErrCode, std::string> what;
  if (local && first == comm.rank()) what = classify(local);
  std::vector<std::int64_t> code{static_cast<std::int64_t>(what.first)};
  ckpt_bcast_i64(comm, code, static_cast<int>(first));
  ckpt_bcast_string(comm, what.second, static_cast<int>(first));
  if (first == comm.rank()) std::rethrow_exception(local);
  const std::string detail = "rank " + std::to_string(first) + " failed: " + what.second;
  if (static_cast<ErrCode>(code[0]) == ErrCode::invalid_argument)
    raise<InvalidArgument>(operation, detail);
  raise<RemoteError>(operation, detail);
}

/// A digest of a list of entries' names, kinds, dtypes and shapes.
inline std::uint32_t structure_digest(const std::vector<CkptEntry>& entries) {
  std::uint32_t crc = 0;
  for (const auto& e : entries) {
    std::string s = e.path + "|" + std::to_string(static_cast<int>(e.kind)) + "|" +
                    name_of(e.dtype) + to_string(e.shape) + ";";
    crc = crc32c(s.data(), s.size(), crc);
  }
  return crc;
}

template <class Comm, class = void>
struct ckpt_comm_ok : std::false_type {};
template <class Comm>
struct ckpt_comm_ok<
    Comm, std::void_t<decltype(int(std::declval<const Comm&>().rank())),
                      decltype(int(std::declval<const Comm&>().size())),
                      decltype(std::declval<Comm&>().barrier()),
                      decltype(std::declval<Comm&>().broadcast(BufferView(), 0)),
                      decltype(std::declval<Comm&>().allreduce(BufferView(), ReduceOp::sum))>>
    : std::true_type {};

template <class T>
struct ckpt_always_false : std::false_type {};

}  // namespace detail

/// Saves a training run's state every N steps and/or T seconds into one verified HDF5 file per
/// checkpoint (written under a temporary name, fsynced, then renamed), keeps the last K, and on
/// start restores the newest valid one.
///
/// Every member function except the accessors is COLLECTIVE over `comm`: all ranks call it in
/// the same order with the same objects (by name, kind and shape). Blocking, except that with
/// `async` the file is written by a background thread on rank 0 (the next collective call waits
/// for it and reports its errors on every rank). Not thread-safe: one thread per rank drives it.
/// Objects are passed as dtrain::named(...) / dtrain::per_rank(...) references; only host memory
/// is read or written, and the caller keeps the objects alive during the call.
///
/// Comm needs: int rank() const; int size() const; void barrier(); void broadcast(BufferView,
/// int root); void allreduce(BufferView, ReduceOp). With comm.transport().mpi_comm() available,
/// the parallel strategies write through MPI-IO.
template <class Comm, class Format = Hdf5Format>
class Checkpointer {
  static_assert(detail::ckpt_comm_ok<Comm>::value,
                "dtrain::Checkpointer<Comm>: Comm must provide int rank() const, int size() const, "
                "void barrier(), void broadcast(BufferView, int root) and "
                "void allreduce(BufferView, ReduceOp)");

 public:
  /// Collective. Creates the run directory and removes temporaries left by an interrupted save.
  Checkpointer(Comm& comm, std::string run_dir, CheckpointOptions options = {})
      : comm_(comm), dir_(std::move(run_dir)), opt_(std::move(options)) {
    std::exception_ptr err;
    try {
      const char* op = "Checkpointer";
      DTRAIN_REQUIRE(!dir_.empty(), op, "empty run directory");
      DTRAIN_REQUIRE(opt_.keep_last >= 1, op, "keep_last must be >= 1, got " << opt_.keep_last);
      DTRAIN_REQUIRE(opt_.every_steps >= 0, op, "every_steps must be >= 0");
      DTRAIN_REQUIRE(opt_.every_seconds >= 0, op, "every_seconds must be >= 0");
      DTRAIN_REQUIRE(!opt_.prefix.empty() && opt_.prefix.find('/') == std::string::npos, op,
                     "invalid file prefix '" << opt_.prefix << "'");
      strategy_ = resolve_strategy();
      if (comm_.rank() == 0) {
        detail::make_directories(dir_, op);
        for (const auto& t : detail::list_stale_temporaries(dir_, opt_.prefix)) {
          DTRAIN_LOG(info, "removing " << t << " left by an interrupted checkpoint save");
          detail::remove_file_quietly(t);
        }
      }
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, "Checkpointer");
  }

  /// Local. Waits for a background write still running (errors are logged: call wait() first
  /// to have them thrown). Never throws.
  ~Checkpointer() {
    if (!pending_.valid()) return;
    try {
      pending_.get();
    } catch (const std::exception& e) {
      DTRAIN_LOG(error, "background checkpoint write failed: " << e.what());
    } catch (...) {
    }
  }

  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Collective. Saves when `step` is due by the step or time interval (and not saved already);
  /// returns whether it saved. With every_seconds set, rank 0's clock decides (one small
  /// broadcast per call).
  template <class... Ts>
  bool maybe_save(std::int64_t step, const Named<Ts>&... objects) {
    bool due = opt_.every_steps > 0 && step > 0 && step % opt_.every_steps == 0;
    if (opt_.every_seconds > 0) {
      std::vector<std::int64_t> flag{
          comm_.rank() == 0 && now_seconds() - last_save_time_ >= opt_.every_seconds ? 1 : 0};
      detail::ckpt_bcast_i64(comm_, flag, 0);
      due = due || flag[0] != 0;
    }
    if (!due || (last_saved_step_ && *last_saved_step_ == step)) return false;
    save(step, objects...);
    return true;
  }

  /// Collective, blocking (with `async`: returns once the host snapshot is taken). Writes
  /// checkpoint `step` of the given objects, then deletes all but the newest keep_last files.
  template <class... Ts>
  void save(std::int64_t step, const Named<Ts>&... objects) {
    const char* op = "checkpoint save";
    finish_pending(op);
    const int rank = comm_.rank(), p = comm_.size();
    std::vector<detail::CkptEntry> repl, mine;
    std::exception_ptr err;
    try {
      DTRAIN_REQUIRE(step >= 0, op, "negative step " << step);
      collect(repl, mine, objects...);
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, op);
    check_replicas_agree(repl, op);

    detail::CkptManifest m;
    m.step = step;
    m.world_size = p;
    m.library_version = version_string();
    m.config = opt_.config;
    m.strategy = name_of(strategy_);
    {
      std::vector<std::int64_t> t{static_cast<std::int64_t>(std::time(nullptr))};
      detail::ckpt_bcast_i64(comm_, t, 0);
      m.created_unix = static_cast<double>(t[0]);
    }
    for (auto& e : mine)
      if (e.kind == detail::EntryKind::tensor) e.crc = crc32c(e.data, e.bytes());
    const std::string final_path = path_for(step);
    const std::string tmp_path = temp_path_for(step);

    if (strategy_ == CheckpointStrategy::rank0) {
      // Rank 0 needs every rank's per-rank state; it writes the file alone.
      std::vector<detail::CkptEntry> gathered = exchange(mine, /*with_data=*/true, /*all=*/false);
      if (opt_.async) {
        if (rank == 0) {
          m.entries = std::move(repl);
          for (auto& e : gathered) m.entries.push_back(std::move(e));
          snapshot(m.entries);
          pending_ = std::async(std::launch::async,
                                [this, m = std::move(m), final_path, tmp_path, rank]() mutable {
                                  detail::RankScope scope(rank);
                                  for (auto& e : m.entries)
                                    if (e.kind == detail::EntryKind::tensor && e.owner < 0)
                                      e.crc = crc32c(e.data, e.bytes());
                                  Format::write(tmp_path, m);
                                  publish(tmp_path, final_path);
                                });
        }
        pending_step_ = step;
        has_pending_ = true;
        mark_saved(step);
        return;
      }
      // Checksums are computed while rank 0 writes the data: by the other ranks (p > 1) or by
      // a helper thread (p == 1), and combined just before rank 0 stores them.
      std::vector<std::int64_t> crcs(repl.size(), 0);
      const std::size_t n_repl = repl.size();
      std::vector<detail::CkptEntry>* target = &repl;
      bool combined = false;
      std::future<void> helper;
      auto combine = [&] {
        if (combined) return;
        combined = true;
        if (helper.valid()) helper.get();
        if (p > 1 && !crcs.empty())
          comm_.allreduce(BufferView(crcs.data(), crcs.size(), DType::i64), ReduceOp::sum);
        for (std::size_t i = 0; i < n_repl; ++i)
          (*target)[i].crc = static_cast<std::uint32_t>(crcs[i]);
      };
      err = nullptr;
      if (rank == 0) {
        try {
          m.entries = std::move(repl);
          target = &m.entries;
          for (auto& e : gathered) m.entries.push_back(std::move(e));
          if (p == 1)
            helper = std::async(std::launch::async, [&, rank] {
              detail::RankScope scope(rank);
              crc_share(m.entries, n_repl, crcs, /*skip_rank0=*/false);
            });
          m.before_checksums = combine;
          Timer phase;
          Format::write(tmp_path, m);
          const double write_ms = phase.millis();
          phase.reset();
          publish(tmp_path, final_path);
          DTRAIN_LOG(debug, "checkpoint " << final_path << ": write+fsync " << write_ms
                                          << " ms, rename+prune " << phase.millis() << " ms");
        } catch (...) {
          err = std::current_exception();
        }
        try {
          combine();  // the other ranks wait in the same allreduce even if the write failed
        } catch (...) {
          if (!err) err = std::current_exception();
        }
      } else {
        crc_share(repl, n_repl, crcs, /*skip_rank0=*/true);
        combine();
      }
      detail::ckpt_agree(comm_, err, op);
      mark_saved(step);
      return;
    }

    // Parallel strategies: every rank creates the same objects in one MPI-IO file.
    fill_replicated_crcs(repl);
    std::vector<detail::CkptEntry> all_ranks = exchange(mine, /*with_data=*/false, /*all=*/true);
    for (auto& e : all_ranks)
      if (e.owner == rank)
        for (const auto& own : mine)
          if (own.path == e.path) e.data = own.data;
    m.entries = std::move(repl);
    for (auto& e : all_ranks) m.entries.push_back(std::move(e));
    err = nullptr;
    try {
      Format::write_parallel(tmp_path, m, comm_, strategy_ == CheckpointStrategy::parallel_slices);
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, op);
    if (rank == 0) {
      try {
        publish(tmp_path, final_path);
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
    mark_saved(step);
  }

  /// Collective. Restores the newest valid checkpoint of the run directory into the objects and
  /// returns its step; std::nullopt (objects untouched) when the directory holds none. A damaged
  /// newest file is reported with a warning and an older one is used; when files exist but none
  /// is valid, throws IoError listing them. A shape, dtype or name mismatch, or an unknown
  /// format version, throws InvalidArgument naming the first mismatching entry.
  template <class... Ts>
  std::optional<std::int64_t> restore_latest(const Named<Ts>&... objects) {
    const char* op = "checkpoint restore";
    finish_pending(op);
    detail::CkptManifest m;
    std::string chosen;
    std::vector<std::string> skipped;
    std::exception_ptr err;
    if (comm_.rank() == 0) {
      try {
        const auto files = detail::list_checkpoint_files(dir_, opt_.prefix, Format::extension);
        std::string tried;
        for (const auto& f : files) {
          try {
            m = Format::read(f.path);
            chosen = f.path;
            break;
          } catch (const IoError& e) {
            DTRAIN_LOG(warn, "skipping damaged checkpoint " << f.path << ": " << e.what());
            tried += "\n  " + f.path + ": " + e.what();
            skipped.push_back(f.path);
          }
        }
        if (!files.empty() && chosen.empty())
          raise<IoError>(op, "no valid checkpoint in " + dir_ + "; tried:" + tried);
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
    std::vector<std::int64_t> found{chosen.empty() ? 0 : 1};
    detail::ckpt_bcast_i64(comm_, found, 0);
    if (!found[0]) return std::nullopt;
    apply(m, chosen, objects...);
    if (comm_.rank() == 0) {
      // Damaged files newer than the restored one would shadow the checkpoints this run writes
      // next; keep them for inspection under a name that is never loaded.
      for (const auto& s : skipped) {
        DTRAIN_LOG(warn, "renaming damaged checkpoint " << s << " to " << s << ".damaged");
        try {
          detail::rename_path(s, s + ".damaged", op);
        } catch (const std::exception& e) {
          DTRAIN_LOG(warn, e.what());
        }
      }
    }
    if (comm_.rank() == 0) DTRAIN_LOG(info, "restored step " << m.step << " from " << chosen);
    return m.step;
  }

  /// Collective. Restores the given checkpoint file (no fallback); returns its step.
  template <class... Ts>
  std::int64_t restore(const std::string& file, const Named<Ts>&... objects) {
    const char* op = "checkpoint restore";
    finish_pending(op);
    detail::CkptManifest m;
    std::exception_ptr err;
    if (comm_.rank() == 0) {
      try {
        m = Format::read(file);
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
    apply(m, file, objects...);
    return m.step;
  }

  /// Collective, blocking: waits for a background write and throws its error on every rank.
  void wait() { finish_pending("checkpoint wait"); }

  /// Local. Path of the file that holds checkpoint `step`.
  std::string path_for(std::int64_t step) const {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(step));
    return dir_ + "/" + opt_.prefix + "-" + digits + Format::extension;
  }
  /// Local. Checkpoint files in the run directory, newest first (valid or not).
  std::vector<detail::FoundCheckpoint> files() const {
    return detail::list_checkpoint_files(dir_, opt_.prefix, Format::extension);
  }
  const std::string& run_dir() const noexcept { return dir_; }
  const CheckpointOptions& options() const noexcept { return opt_; }
  /// The strategy in use after resolving `automatic`.
  CheckpointStrategy strategy() const noexcept { return strategy_; }
  /// Step of the last save or restore of this object, if any.
  std::optional<std::int64_t> last_step() const noexcept { return last_saved_step_; }

 private:
  CheckpointStrategy resolve_strategy() const {
    constexpr bool parallel_ok = Format::template supports_parallel<Comm>();
    CheckpointStrategy s = opt_.strategy;
    if (s == CheckpointStrategy::automatic)
      // Measured on one node (benchmarks/results/ckpt.md): a single POSIX writer beat MPI-IO.
      s = CheckpointStrategy::rank0;
    if (s != CheckpointStrategy::rank0) {
      DTRAIN_REQUIRE(parallel_ok, "Checkpointer",
                     "strategy " << name_of(s)
                                 << " needs an MPI communicator (comm.transport().mpi_comm()) "
                                    "and parallel HDF5");
      DTRAIN_REQUIRE(!opt_.async, "Checkpointer",
                     "asynchronous saves are written by rank 0 alone; use strategy rank0");
    }
    return s;
  }

  std::string temp_path_for(std::int64_t step) const {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(step));
    return dir_ + "/." + opt_.prefix + "-" + digits + Format::extension + ".tmp";
  }

  void mark_saved(std::int64_t step) {
    last_saved_step_ = step;
    last_save_time_ = now_seconds();
  }

  template <class T>
  void check_top_name(const Named<T>& n, std::set<std::string>& names) const {
    detail::check_state_name(n.name, "checkpoint");
    DTRAIN_REQUIRE(n.name.find('/') == std::string::npos && n.name != "ranks" && n.name != "config",
                   "checkpoint",
                   "object name '" << n.name
                                   << "' is reserved or has a '/' (names: one component, not "
                                      "'ranks' or 'config')");
    DTRAIN_REQUIRE(names.insert(n.name).second, "checkpoint",
                   "object name '" << n.name << "' passed twice");
    DTRAIN_REQUIRE(n.object != nullptr, "checkpoint", "object '" << n.name << "' is null");
    static_assert(is_serializable_v<T>,
                  "dtrain checkpoint: the object type has no visit_state and no "
                  "dtrain::serializer specialisation");
  }

  template <class... Ts>
  void collect(std::vector<detail::CkptEntry>& repl, std::vector<detail::CkptEntry>& mine,
               const Named<Ts>&... objects) {
    std::set<std::string> names;
    (check_top_name(objects, names), ...);
    const int rank = comm_.rank();
    auto one = [&](const auto& n) {
      if (n.placement == Placement::replicated) {
        detail::SaveCollector v(repl, "/" + n.name, -1);
        visit_object(v, *n.object);
      } else {
        detail::SaveCollector v(mine, "/ranks/" + std::to_string(rank) + "/" + n.name, rank);
        visit_object(v, *n.object);
      }
    };
    (one(objects), ...);
    std::set<std::string> paths;
    for (const auto* list : {&repl, &mine})
      for (const auto& e : *list)
        DTRAIN_REQUIRE(paths.insert(e.path).second, "checkpoint save",
                       "state name " << e.path << " visited twice");
  }

  /// Replicated objects must have the same structure on every rank (same visit order, names,
  /// dtypes and shapes), or the file would mix them.
  void check_replicas_agree(const std::vector<detail::CkptEntry>& repl, const char* op) {
    const std::int64_t d =
        detail::structure_digest(repl) ^ (static_cast<std::int64_t>(repl.size()) << 32);
    const std::int64_t lo = detail::ckpt_allreduce_i64(comm_, d, ReduceOp::min);
    const std::int64_t hi = detail::ckpt_allreduce_i64(comm_, d, ReduceOp::max);
    DTRAIN_REQUIRE(lo == hi, op,
                   "replicated objects differ in structure between ranks (names, dtypes or "
                   "shapes); pass rank-specific state with dtrain::per_rank");
  }

  /// This rank's byte-balanced share of the checksums of the first n (replicated) entries,
  /// into crcs (zeros elsewhere, so that an allreduce(sum) assembles them: replicas are
  /// identical). With skip_rank0 rank 0 gets no share (it is busy writing).
  void crc_share(const std::vector<detail::CkptEntry>& entries, std::size_t n,
                 std::vector<std::int64_t>& crcs, bool skip_rank0) const {
    const int p = comm_.size(), rank = comm_.rank();
    const int first = skip_rank0 && p > 1 ? 1 : 0;
    std::vector<std::size_t> load(static_cast<std::size_t>(p - first), 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (entries[i].kind != detail::EntryKind::tensor) continue;
      const auto k =
          static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[k] += entries[i].bytes() + 1;
      if (static_cast<int>(k) + first == rank)
        crcs[i] = static_cast<std::int64_t>(crc32c(entries[i].data, entries[i].bytes()));
    }
  }

  /// Checksums of replicated tensors, computed in parallel over the ranks.
  void fill_replicated_crcs(std::vector<detail::CkptEntry>& repl) {
    std::vector<std::int64_t> crcs(repl.size(), 0);
    crc_share(repl, repl.size(), crcs, false);
    if (comm_.size() > 1 && !crcs.empty())
      comm_.allreduce(BufferView(crcs.data(), crcs.size(), DType::i64), ReduceOp::sum);
    for (std::size_t i = 0; i < repl.size(); ++i) repl[i].crc = static_cast<std::uint32_t>(crcs[i]);
  }

  /// Moves every rank's entries to rank 0 (all == false) or to every rank (all == true).
  /// Returns the entries of all ranks in rank order (rank 0 / everyone), empty elsewhere.
  std::vector<detail::CkptEntry> exchange(const std::vector<detail::CkptEntry>& mine,
                                          bool with_data, bool all) {
    const int p = comm_.size(), rank = comm_.rank();
    detail::BlobWriter w;
    w.put_i64(static_cast<std::int64_t>(mine.size()));
    for (const auto& e : mine) detail::encode_entry(w, e, with_data);
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(p), 0);
    sizes[static_cast<std::size_t>(rank)] = static_cast<std::int64_t>(w.bytes().size());
    if (p > 1) comm_.allreduce(BufferView(sizes.data(), sizes.size(), DType::i64), ReduceOp::sum);
    std::vector<detail::CkptEntry> out;
    for (int s = 0; s < p; ++s) {
      std::vector<unsigned char> blob;
      if (s == rank) blob = w.bytes();
      if (s != 0 || all) {
        if (p > 1) detail::ckpt_bcast_bytes(comm_, blob, s);
      }
      if (!all && rank != 0) continue;
      if (s == rank && with_data) {
        // Our own entries: point at the caller's memory instead of a copy.
        for (const auto& e : mine) {
          detail::CkptEntry c = e;
          out.push_back(std::move(c));
        }
        continue;
      }
      detail::BlobReader r(blob.data(), blob.size());
      const auto n = r.get_i64();
      for (std::int64_t i = 0; i < n; ++i) out.push_back(detail::decode_entry(r));
    }
    return out;
  }

  /// Copies every entry that still points at caller memory into the snapshot arena, which is
  /// kept between saves so that later snapshots cost a memcpy, not fresh page faults.
  void snapshot(std::vector<detail::CkptEntry>& entries) {
    auto aligned = [](std::size_t n) { return (n + 63) / 64 * 64; };
    std::size_t total = 0;
    for (const auto& e : entries)
      if (e.kind == detail::EntryKind::tensor && e.storage.empty()) total += aligned(e.bytes());
    if (total > arena_bytes_) {
      arena_.reset(new unsigned char[total]);
      arena_bytes_ = total;
    }
    std::size_t off = 0;
    for (auto& e : entries) {
      if (e.kind != detail::EntryKind::tensor || !e.storage.empty()) continue;
      const std::size_t n = e.bytes();
      if (n) std::memcpy(arena_.get() + off, e.data, n);
      e.data = arena_.get() + off;
      off += aligned(n);
    }
  }

  /// Rank 0: make the temporary durable under its final name, then prune old checkpoints.
  void publish(const std::string& tmp_path, const std::string& final_path) {
    const char* op = "checkpoint save";
    detail::rename_path(tmp_path, final_path, op);
    detail::fsync_path(dir_, true, op);
    const auto found = detail::list_checkpoint_files(dir_, opt_.prefix, Format::extension);
    for (std::size_t i = static_cast<std::size_t>(opt_.keep_last); i < found.size(); ++i)
      detail::remove_file_quietly(found[i].path);
  }

  void finish_pending(const char* op) {
    if (!has_pending_) return;
    has_pending_ = false;
    std::exception_ptr err;
    if (pending_.valid()) {
      try {
        if (pending_.wait_for(std::chrono::duration<double>(opt_.wait_timeout_seconds)) !=
            std::future_status::ready)
          raise<TimeoutError>(op, "background write of checkpoint step " +
                                      std::to_string(pending_step_) + " still running after " +
                                      std::to_string(opt_.wait_timeout_seconds) + " s");
        pending_.get();
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
  }

  struct FetchCtx {
    Comm* comm;
    int rank;
    bool broadcast;
  };

  static void fetch_entry(void* ctx, const detail::CkptEntry& e, BufferView dst) {
    auto* c = static_cast<FetchCtx*>(ctx);
    const std::size_t n = e.bytes();
    if ((c->rank == 0 || !c->broadcast) && n) std::memcpy(dst.data, e.data, n);
    if (c->broadcast && dst.count) c->comm->broadcast(dst, 0);
  }

  template <class... Ts>
  void apply(detail::CkptManifest& m, const std::string& file, const Named<Ts>&... objects) {
    const char* op = "checkpoint restore";
    const int rank = comm_.rank(), p = comm_.size();
    // Everyone gets the file's metadata (names, shapes, scalars) from rank 0.
    {
      detail::BlobWriter w;
      if (rank == 0) {
        detail::encode_header(w, m);
        w.put_i64(static_cast<std::int64_t>(m.entries.size()));
        for (const auto& e : m.entries) detail::encode_entry(w, e, false);
      }
      if (p > 1) {
        detail::ckpt_bcast_bytes(comm_, w.bytes(), 0);
        if (rank != 0) {
          detail::BlobReader r(w.bytes().data(), w.bytes().size());
          detail::decode_header(r, m);
          const auto n = r.get_i64();
          m.entries.clear();
          for (std::int64_t i = 0; i < n; ++i) m.entries.push_back(detail::decode_entry(r));
        }
      }
    }
    detail::LoadVisitor::Index index;
    for (const auto& e : m.entries) index[e.path] = &e;
    const bool resized = m.world_size != p;

    // Check pass: nothing is modified until every rank agrees that everything matches.
    std::string trace;
    std::exception_ptr err;
    try {
      std::set<std::string> names;
      (check_top_name(objects, names), ...);
      std::string first;
      std::set<std::string> visited;
      auto one = [&](const auto& n) {
        if (!first.empty()) return;
        std::string prefix = "/" + n.name;
        if (n.placement == Placement::per_rank) {
          if (resized) {
            if (!opt_.reset_per_rank_on_resize)
              first = "per-rank object '" + n.name + "': the checkpoint was written by " +
                      std::to_string(m.world_size) + " ranks and this run has " +
                      std::to_string(p) +
                      " (set CheckpointOptions::reset_per_rank_on_resize to keep its current "
                      "state)";
            return;
          }
          prefix = "/ranks/" + std::to_string(rank) + "/" + n.name;
        }
        detail::LoadVisitor v(index, prefix, detail::LoadVisitor::Mode::check);
        visit_object(v, *n.object);
        if (n.placement == Placement::replicated) trace += v.trace();
        visited.insert(v.visited().begin(), v.visited().end());
        if (!v.mismatch().empty()) first = v.mismatch();
        for (const auto& e : m.entries)
          if (rank == 0 && e.path.compare(0, prefix.size() + 1, prefix + "/") == 0 &&
              !visited.count(e.path))
            DTRAIN_LOG(warn, "checkpoint " << file << " holds " << e.path
                                           << ", which the object does not visit; ignored");
      };
      (one(objects), ...);
      if (!first.empty())
        raise<InvalidArgument>(op, file + " does not match the objects: " + first);
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, op);
    {
      const std::int64_t d = crc32c(trace.data(), trace.size());
      const std::int64_t lo = detail::ckpt_allreduce_i64(comm_, d, ReduceOp::min);
      const std::int64_t hi = detail::ckpt_allreduce_i64(comm_, d, ReduceOp::max);
      DTRAIN_REQUIRE(lo == hi, op,
                     "replicated objects differ in structure between ranks; pass rank-specific "
                     "state with dtrain::per_rank");
    }

    // Replicated state: rank 0 fills its objects from the file and broadcasts tensor by tensor.
    FetchCtx bc{&comm_, rank, p > 1};
    auto apply_replicated = [&](const auto& n) {
      if (n.placement != Placement::replicated) return;
      detail::LoadVisitor v(index, "/" + n.name, detail::LoadVisitor::Mode::apply, &fetch_entry,
                            &bc);
      visit_object(v, *n.object);
    };
    (apply_replicated(objects), ...);

    // Per-rank state: rank 0 sends each rank its own entries.
    if (!resized) {
      for (int s = 0; s < p; ++s) {
        std::vector<detail::CkptEntry> own;
        if (s == 0) {
          if (rank != 0) continue;
        } else {
          detail::BlobWriter w;
          if (rank == 0) {
            std::int64_t count = 0;
            for (const auto& e : m.entries) count += e.owner == s;
            w.put_i64(count);
            for (const auto& e : m.entries)
              if (e.owner == s) detail::encode_entry(w, e, true);
          }
          detail::ckpt_bcast_bytes(comm_, w.bytes(), 0);
          if (rank != s) continue;
          detail::BlobReader r(w.bytes().data(), w.bytes().size());
          const auto n = r.get_i64();
          for (std::int64_t i = 0; i < n; ++i) own.push_back(detail::decode_entry(r));
        }
        detail::LoadVisitor::Index own_index;
        if (s == 0)
          own_index = index;
        else
          for (const auto& e : own) own_index[e.path] = &e;
        FetchCtx local{&comm_, rank, false};
        auto apply_own = [&](const auto& n) {
          if (n.placement != Placement::per_rank) return;
          detail::LoadVisitor v(own_index, "/ranks/" + std::to_string(rank) + "/" + n.name,
                                detail::LoadVisitor::Mode::apply, &fetch_entry, &local);
          visit_object(v, *n.object);
        };
        (apply_own(objects), ...);
      }
    } else if (rank == 0 && opt_.reset_per_rank_on_resize) {
      DTRAIN_LOG(warn, "checkpoint " << file << " was written by " << m.world_size
                                     << " ranks; per-rank objects keep their current state");
    }
    mark_saved(m.step);
  }

  Comm& comm_;
  std::string dir_;
  CheckpointOptions opt_;
  CheckpointStrategy strategy_ = CheckpointStrategy::rank0;
  std::optional<std::int64_t> last_saved_step_;
  double last_save_time_ = now_seconds();
  std::future<void> pending_;
  std::unique_ptr<unsigned char[]> arena_;  // async snapshot, reused; rank 0 only
  std::size_t arena_bytes_ = 0;
  bool has_pending_ = false;
  std::int64_t pending_step_ = -1;
};

}  // namespace dtrain
