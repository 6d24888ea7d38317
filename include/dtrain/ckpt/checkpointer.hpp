// SPDX-License-Identifier: BSD-3-Clause
// dtrain: Checkpointer, periodic atomic checkpoints of a training run, restored exactly.
//
// This header has no HDF5 dependency: the file format is a policy, and the default one,
// dtrain::Hdf5Format, lives in <dtrain/ckpt/hdf5.hpp>. Include that header to use Checkpointer
// with its default format.
//
// The pieces: options in <dtrain/ckpt/checkpoint_options.hpp>; the write strategies in
// ckpt/detail/save_rank0.hpp (rank 0 alone, now or from a snapshot) and save_parallel.hpp
// (MPI-IO); the restore path in ckpt/detail/restore.hpp (and the distributed restore's plan and
// verification in restore_distributed.hpp); the compound collectives they share
// (error agreement, gathering entries) in ckpt/detail/collectives.hpp; tensors held in parts
// over the ranks (sharded state) are streamed to rank 0's writer, or assembled for an
// asynchronous snapshot, by ckpt/detail/assemble.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/checkpoint_options.hpp>
#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/assemble.hpp>
#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/ckpt/detail/levels.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/ckpt/detail/objects.hpp>
#include <dtrain/ckpt/detail/part_files.hpp>
#include <dtrain/ckpt/detail/restore.hpp>
#include <dtrain/ckpt/detail/restore_distributed.hpp>
#include <dtrain/ckpt/detail/run_id.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/ckpt/detail/save_parallel.hpp>
#include <dtrain/ckpt/detail/save_rank0.hpp>
#include <dtrain/ckpt/detail/snapshot.hpp>
#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/core/version.hpp>

namespace dtrain {

struct Hdf5Format;  // <dtrain/ckpt/hdf5.hpp>

/// Where a restore found its checkpoint (CheckpointLevelOptions).
enum class CheckpointLevel : unsigned char {
  none,     ///< nothing restored yet
  local,    ///< the node-local directory of rank 0's node (part files: of every rank's node)
  partner,  ///< another node's local directory (the partner copy), copied back to rank 0's node
            ///< (part files: to the node of each rank that lost its own)
  shared,   ///< the run directory
};

constexpr const char* name_of(CheckpointLevel l) noexcept {
  switch (l) {
    case CheckpointLevel::none: return "none";
    case CheckpointLevel::local: return "node-local";
    case CheckpointLevel::partner: return "partner";
    case CheckpointLevel::shared: return "shared";
  }
  return "?";
}

/// Saves a training run's state every N steps and/or T seconds into one verified HDF5 file per
/// checkpoint (written under a temporary name, fsynced, then renamed), keeps the last K, and on
/// start restores the newest valid one.
///
/// Every member function except the accessors is COLLECTIVE over `comm`: all ranks call it in
/// the same order with the same objects (by name, kind and shape). Blocking, except that with
/// `async` the file is written by a background thread on rank 0 (the next collective call waits
/// for it and reports its errors on every rank). Not thread-safe: one thread per rank drives it.
/// Objects are passed as dtrain::named(...) / dtrain::per_rank(...) references, and the caller
/// keeps them alive during the call. Tensors in host memory are read and written in place;
/// tensors in an execution policy's device memory (visited with an ExecCopier, as
/// BasicSequential and the optimizers do through StateMirror) are downloaded through the
/// policy's copies into a host staging buffer kept between saves, and restored by upload, so
/// the file is the same whichever policy wrote it and restores into any policy. The host never
/// dereferences device memory.
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
  /// Collective. Applies the environment to the options (CheckpointOptions::read_env), creates
  /// the run directory, removes temporaries left by an interrupted save, and reads the run's
  /// identity from the run directory (creating it on the run's first start).
  Checkpointer(Comm& comm, std::string run_dir, CheckpointOptions options = {})
      : comm_(comm), dir_(std::move(run_dir)), opt_(std::move(options)) {
    std::exception_ptr err;
    int node_label = 0;
    try {
      const char* op = "Checkpointer";
      if (opt_.read_env) opt_ = opt_.with_env();
      DTRAIN_REQUIRE(!dir_.empty(), op, "empty run directory");
      DTRAIN_REQUIRE(opt_.keep_last >= 1, op, "keep_last must be >= 1, got " << opt_.keep_last);
      DTRAIN_REQUIRE(opt_.every_steps >= 0, op, "every_steps must be >= 0");
      DTRAIN_REQUIRE(opt_.every_seconds >= 0, op, "every_seconds must be >= 0");
      DTRAIN_REQUIRE(!opt_.prefix.empty() && opt_.prefix.find('/') == std::string::npos, op,
                     "invalid file prefix '" << opt_.prefix << "'");
      strategy_ = resolve_strategy();
      restore_ = resolve_restore();
      if (levels_on()) node_label = check_levels();
      if (comm_.rank() == 0) {
        detail::make_directories(dir_, op);
        for (const auto& t : detail::list_stale_temporaries(dir_, opt_.prefix)) {
          DTRAIN_LOG(info, "removing " << t << " left by an interrupted checkpoint save");
          detail::remove_file_quietly(t);
        }
        run_id_ = detail::resolve_run_id(dir_, opt_.run_id, op);
      }
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, "Checkpointer");
    detail::ckpt_bcast_string(comm_, run_id_, 0);
    // Each rank applied its own environment: a level setting on some ranks only would have them
    // take different paths through every save and restore.
    {
      const CheckpointLevelOptions& l = opt_.levels;
      const std::string s =
          detail::concat(l.enabled(), ' ', l.local_every, ' ', l.partner, ' ', l.shared_every);
      DTRAIN_REQUIRE(detail::ckpt_same_everywhere(comm_, crc32c(s.data(), s.size()),
                                                  static_cast<std::uint32_t>(s.size())),
                     "Checkpointer",
                     "the checkpoint level options differ between ranks (levels.local_dir set or "
                     "not, local_every, partner, shared_every): DTRAIN_CKPT_* set for some ranks "
                     "only?");
    }
    if (!levels_on()) return;
    nodes_ = detail::ckpt_node_layout(comm_, node_label);
    try {
      if (nodes_.is_leader(comm_.rank())) {
        detail::make_directories(opt_.levels.local_dir, "Checkpointer");
        for (const auto& t : detail::list_stale_temporaries(opt_.levels.local_dir, opt_.prefix)) {
          DTRAIN_LOG(info, "removing " << t << " left by an interrupted checkpoint save");
          detail::remove_file_quietly(t);
        }
      }
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, "Checkpointer");
    if (comm_.rank() == 0 && opt_.levels.partner && nodes_.nodes() == 1)
      DTRAIN_LOG(info, "checkpoint levels: one node, so no partner copies");
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

  /// Collective. Whether `step` is due by the step or time interval (and not saved already):
  /// what maybe_save decides. With every_seconds set, rank 0's clock decides (one small
  /// broadcast per call), so every rank gets the same answer. Lets a caller prepare its objects
  /// only when a save is due (e.g. GradientSync::gather_state after sharded steps) and then call
  /// save().
  bool due(std::int64_t step) {
    bool by_step = opt_.every_steps > 0 && step > 0 && step % opt_.every_steps == 0;
    if (levels_on() && opt_.levels.local_every > 0 && step > 0 &&
        step % opt_.levels.local_every == 0)
      by_step = true;
    if (opt_.every_seconds > 0) {
      std::vector<std::int64_t> flag{
          comm_.rank() == 0 && now_seconds() - last_save_time_ >= opt_.every_seconds ? 1 : 0};
      detail::ckpt_bcast_i64(comm_, flag, 0);
      by_step = by_step || flag[0] != 0;
    }
    return by_step && !(last_saved_step_ && *last_saved_step_ == step);
  }

  /// Collective. Saves when due(step); returns whether it saved.
  template <class... Ts>
  bool maybe_save(std::int64_t step, const Named<Ts>&... objects) {
    if (!due(step)) return false;
    save(step, objects...);
    return true;
  }

  /// Collective, blocking (with `async`: returns once the host snapshot is taken). Writes
  /// checkpoint `step` of the given objects, then deletes all but the newest keep_last files.
  template <class... Ts>
  void save(std::int64_t step, const Named<Ts>&... objects) {
    const char* op = "checkpoint save";
    finish_pending(op);
    detail::CkptSaveJob job;
    std::exception_ptr err;
    try {
      DTRAIN_REQUIRE(step >= 0, op, "negative step " << step);
      detail::collect_objects(comm_.rank(), job.repl, job.mine, objects...);
      // Exec-memory (device) tensors are downloaded into host memory before anything reads
      // them: checksums, the gather and the writers then see host bytes only.
      stage_.take({&job.repl, &job.mine}, detail::SnapshotOf::device);
    } catch (...) {
      err = std::current_exception();
    }
    // A background flush to the shared level that failed since the last call is reported here,
    // on every rank, as a failed asynchronous write is.
    if (!err && flusher_) err = flusher_->take_error();
    detail::ckpt_agree(comm_, err, op);
    // Replicated objects must have the same structure on every rank (same visit order, names,
    // dtypes and shapes), or the file would mix them.
    DTRAIN_REQUIRE(detail::ckpt_same_everywhere(comm_, detail::structure_digest(job.repl),
                                                static_cast<std::uint32_t>(job.repl.size())),
                   op,
                   "replicated objects differ in structure between ranks (names, dtypes or "
                   "shapes); pass rank-specific state with dtrain::per_rank");
    // Tensors held in parts over the ranks (a sharded optimizer state) are never assembled
    // whole, except for an asynchronous save's snapshot on rank 0: a parallel write has every
    // rank write its own parts, and rank 0's write (levels included) stores them as they stream
    // in, a piece at a time.
    detail::PartsLayout layout;
    if (strategy_ == CheckpointStrategy::rank0 && opt_.async)
      detail::assemble_parts(comm_, job.repl, parts_, op);
    else
      layout = detail::parts_in_place(comm_, job.repl, op);

    detail::CkptManifest& m = job.m;
    m.step = step;
    m.world_size = comm_.size();
    m.library_version = version_string();
    m.config = opt_.config;
    m.strategy = name_of(strategy_);
    m.run_id = run_id_;
    m.shared_step = step;  // written to the run directory; save_levels says otherwise
    {
      std::vector<std::int64_t> t{static_cast<std::int64_t>(std::time(nullptr))};
      detail::ckpt_bcast_i64(comm_, t, 0);
      m.created_unix = static_cast<double>(t[0]);
    }
    for (auto& e : job.mine)
      if (e.kind == detail::EntryKind::tensor) e.crc = crc32c(e.data, e.bytes());
    job.target.dir = dir_;
    job.target.prefix = opt_.prefix;
    job.target.extension = Format::extension;
    job.target.keep_last = opt_.keep_last;
    job.target.tmp_path = temp_path_for(step);
    job.target.final_path = path_for(step);

    if (levels_on()) {
      const bool in_parts = std::any_of(job.repl.begin(), job.repl.end(),
                                        [](const detail::CkptEntry& e) { return e.sharded; });
      if (in_parts)
        save_levels_parts(job, layout, op);
      else
        save_levels(job, layout, op);
    } else if (strategy_ == CheckpointStrategy::rank0 && opt_.async) {
      pending_ = detail::save_rank0_async<Format>(comm_, job, arena_);
      pending_step_ = step;
      has_pending_ = true;
    } else if (strategy_ == CheckpointStrategy::rank0) {
      detail::save_rank0<Format>(comm_, job, op, &layout);
    } else {
      detail::save_parallel<Format>(comm_, job, strategy_ == CheckpointStrategy::parallel_slices,
                                    opt_.parallel_write_timeout_seconds, op);
    }
    if (!has_pending_) release_buffers();
    mark_saved(step);
  }

  /// Local. Host bytes this rank keeps for the next save (CheckpointOptions::keep_buffers): the
  /// download of device tensors, and on rank 0 the asynchronous snapshot (with the tensors held
  /// in parts, assembled for it). 0 with keep_buffers off once a save is complete.
  std::size_t buffer_bytes() const noexcept {
    return stage_.bytes() + arena_.bytes() + parts_.bytes();
  }

  /// Collective. Restores the newest valid checkpoint of the run directory into the objects and
  /// returns its step; std::nullopt (objects untouched) when the directory holds none. A damaged
  /// newest file is reported with a warning and an older one is used; when files exist but none
  /// is valid, throws IoError listing them. A shape, dtype or name mismatch, or an unknown
  /// format version, throws InvalidArgument naming the first mismatching entry. Every checksum
  /// of a file is verified before any object is modified: by rank 0 reading the file in pieces
  /// (RestoreStrategy::rank0), or by every rank reading its share (distributed). No rank keeps
  /// the file's tensors: each is read as it loads (into the object's memory, or a device
  /// tensor's staging buffer) and checked again; beyond the objects a rank holds one piece or
  /// one device tensor's staging, whatever the file's size. A tensor that fails that second
  /// check (the file changed since) throws IoError on every rank after the restore's
  /// collectives; the objects are then partly restored.
  template <class... Ts>
  std::optional<std::int64_t> restore_latest(const Named<Ts>&... objects) {
    finish_pending("checkpoint restore");
    detail::CkptChoice<Format> c;
    if (levels_on()) {
      if (const auto step = restore_parts(objects...)) return step;
      if (!choose_levels(c)) return std::nullopt;
      shared_step_ = restored_shared_step_;
      detail::restore_objects(comm_, opt_, c.m, c.file, source_of(c), objects...);
      mark_saved(c.m.step);
      if (comm_.rank() == 0)
        DTRAIN_LOG(info, "restored step " << c.m.step << " from " << level_text_);
      return c.m.step;
    }
    if (!choose(c, nullptr)) return std::nullopt;
    detail::restore_objects(comm_, opt_, c.m, c.file, source_of(c), objects...);
    mark_saved(c.m.step);
    if (comm_.rank() == 0) {
      // Damaged files newer than the restored one would shadow the checkpoints this run writes
      // next; keep them for inspection under a name that is never loaded.
      for (const auto& s : c.skipped) {
        DTRAIN_LOG(warn, "renaming damaged checkpoint " << s << " to " << s << ".damaged");
        try {
          detail::rename_path(s, s + ".damaged", "checkpoint restore");
        } catch (const std::exception& e) {
          DTRAIN_LOG(warn, e.what());
        }
      }
      DTRAIN_LOG(info, "restored step " << c.m.step << " from " << c.file);
    }
    return c.m.step;
  }

  /// Collective. Restores the given checkpoint file (no fallback); returns its step.
  template <class... Ts>
  std::int64_t restore(const std::string& file, const Named<Ts>&... objects) {
    finish_pending("checkpoint restore");
    detail::CkptChoice<Format> c;
    choose(c, &file);
    detail::restore_objects(comm_, opt_, c.m, file, source_of(c), objects...);
    mark_saved(c.m.step);
    return c.m.step;
  }

  /// Collective, blocking: waits for a background write, and for the flush to the shared level
  /// with levels (at most wait_timeout_seconds), and throws their error on every rank.
  void wait() {
    finish_pending("checkpoint wait");
    if (!levels_on()) return;
    std::exception_ptr err;
    if (flusher_) {
      try {
        if (!flusher_->wait_idle(opt_.wait_timeout_seconds))
          raise<TimeoutError>(
              "checkpoint wait",
              detail::concat("the flush to the shared level is still running after ",
                             opt_.wait_timeout_seconds, " s"));
        err = flusher_->take_error();
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, "checkpoint wait");
  }

  /// Local. Path of the file that holds checkpoint `step`.
  std::string path_for(std::int64_t step) const { return dir_ + "/" + file_name(step); }
  /// Local. Checkpoint files in the run directory, newest first (valid or not).
  std::vector<detail::FoundCheckpoint> files() const {
    return detail::list_checkpoint_files(dir_, opt_.prefix, Format::extension);
  }
  /// Local. Path of checkpoint `step` in this rank's node-local directory (levels).
  std::string local_path_for(std::int64_t step) const {
    return opt_.levels.local_dir + "/" + file_name(step);
  }
  /// Local. Checkpoint files in this rank's node-local directory, newest first (levels).
  std::vector<detail::FoundCheckpoint> local_files() const {
    if (!levels_on()) return {};
    return detail::list_checkpoint_files(opt_.levels.local_dir, opt_.prefix, Format::extension);
  }
  /// Local. The level the last restore_latest restored from (the same on every rank), and the
  /// node whose directory held it (-1 for the shared level).
  CheckpointLevel restored_level() const noexcept { return restored_level_; }
  int restored_node() const noexcept { return restored_node_; }
  /// Local. The run's identity, recorded in every file this object writes (the same on every
  /// rank): CheckpointOptions::run_id, or the run directory's own.
  const std::string& run_id() const noexcept { return run_id_; }
  /// Local. This rank's node and the number of nodes, as the levels number them (node 0 holds
  /// rank 0); 0 and 1 without levels.
  int node() const { return nodes_.node_of.empty() ? 0 : nodes_.node_of[comm_.rank()]; }
  int nodes() const { return nodes_.node_of.empty() ? 1 : nodes_.nodes(); }
  /// Local. Whether a flush to the shared level is running or queued (rank 0; false elsewhere).
  bool flush_in_progress() const { return flusher_ && flusher_->busy(); }
  const std::string& run_dir() const noexcept { return dir_; }
  const CheckpointOptions& options() const noexcept { return opt_; }
  /// The strategy in use after resolving `automatic`.
  CheckpointStrategy strategy() const noexcept { return strategy_; }
  /// Who reads a checkpoint at restore, after resolving `automatic`.
  RestoreStrategy restore_strategy() const noexcept { return restore_; }
  /// Step of the last save or restore of this object, if any.
  std::optional<std::int64_t> last_step() const noexcept { return last_saved_step_; }

 private:
  // Collective: the file to restore, verified, its metadata and reader (on rank 0, or with the
  // plan on every rank when distributed): `only`, or the newest valid file of the run directory
  // (false when there is none). Throws on every rank when it finds none valid, or `only` is not.
  bool choose(detail::CkptChoice<Format>& c, const std::string* only) {
    const char* op = "checkpoint restore";
    const bool distributed = restore_ == RestoreStrategy::distributed;
    std::vector<std::string> candidates;  // distributed: rank 0's list, newest first
    std::exception_ptr err;
    if (comm_.rank() == 0) {
      try {
        if (only && distributed) {
          candidates.push_back(*only);
        } else if (only) {
          c.m = Format::verify(*only);
          c.file = *only;
        } else {
          const auto files = detail::list_checkpoint_files(dir_, opt_.prefix, Format::extension);
          std::string tried;
          for (const auto& f : files) {
            if (distributed) {
              candidates.push_back(f.path);
              continue;
            }
            try {
              c.m = Format::verify(f.path);
              c.file = f.path;
              break;
            } catch (const IoError& e) {
              DTRAIN_LOG(warn, "skipping damaged checkpoint " << f.path << ": " << e.what());
              tried += "\n  " + f.path + ": " + e.what();
              c.skipped.push_back(f.path);
            }
          }
          if (!distributed && !files.empty() && c.file.empty())
            raise<IoError>(op, "no valid checkpoint in " + dir_ + "; tried:" + tried);
        }
        if (!c.file.empty()) c.reader = std::make_unique<typename Format::Reader>(c.file);
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
    if (distributed) {
      if (!detail::choose_distributed<Format>(comm_, candidates, only == nullptr, dir_, c))
        return false;
    } else {
      std::vector<std::int64_t> found{c.file.empty() ? 0 : 1};
      detail::ckpt_bcast_i64(comm_, found, 0);
      if (!found[0]) return false;
    }
    // Test knob: rank 0 may change the verified file before the reads (the others wait for it
    // in the restore's next collective). The hook must not throw: nothing agrees on it.
    if (comm_.rank() == 0)
      if (const auto& hook = detail::ckpt_restore_hook()) hook(c.file);
    return true;
  }

  // Where the restore of a chosen file reads its tensors: rank 0's reader, or every rank's runs.
  detail::CkptSource source_of(const detail::CkptChoice<Format>& c) const {
    detail::CkptSource s;
    const typename Format::Reader* reader = c.reader.get();  // null where nothing is read
    if (restore_ == RestoreStrategy::distributed) {
      s.plan = &c.plan;  // read_run is called for this rank's own runs only
      s.read_run = [reader](const detail::CkptEntry& e, const detail::CkptRun& run, void* dst) {
        reader->check_since_verified(e, reader->read_run(e, run.first, run.count, dst), run.crc);
      };
      // Tensors held in parts: every rank reads its own parts, opening the file where the plan
      // gave it no runs.
      auto own = std::make_shared<std::unique_ptr<typename Format::Reader>>();
      s.read_span = [reader, own, file = c.file](const detail::CkptEntry& e, std::uint64_t first,
                                                 std::uint64_t count, void* dst) {
        const typename Format::Reader* r = reader;
        if (!r) {
          if (!*own) *own = std::make_unique<typename Format::Reader>(file);
          r = own->get();
        }
        return r->read_run(e, first, count, dst);
      };
    } else if (reader) {
      s.read = [reader](const detail::CkptEntry& e, void* dst) { reader->read(e, dst); };
      s.read_span = [reader](const detail::CkptEntry& e, std::uint64_t first, std::uint64_t count,
                             void* dst) { return reader->read_run(e, first, count, dst); };
    }
    return s;
  }

  RestoreStrategy resolve_restore() const {
    if (opt_.restore != RestoreStrategy::automatic) return opt_.restore;
    return strategy_ == CheckpointStrategy::rank0 ? RestoreStrategy::rank0
                                                  : RestoreStrategy::distributed;
  }

  CheckpointStrategy resolve_strategy() const {
    constexpr bool parallel_ok = Format::template supports_parallel<Comm>();
    CheckpointStrategy s = opt_.strategy;
    if (s == CheckpointStrategy::automatic)
      // Measured on one node (benchmarks/RESULTS.md, Checkpoints): a single POSIX writer beat
      // MPI-IO.
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

  std::string file_name(std::int64_t step) const {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(step));
    return opt_.prefix + "-" + digits + Format::extension;
  }
  std::string temp_path_for(std::int64_t step) const {
    return dir_ + "/." + file_name(step) + ".tmp";
  }
  // Where checkpoint `step` goes in directory `dir` (the run directory or the node-local one).
  detail::CkptTarget target_in(const std::string& dir, std::int64_t step) const {
    detail::CkptTarget t;
    t.dir = dir;
    t.prefix = opt_.prefix;
    t.extension = Format::extension;
    t.keep_last = opt_.keep_last;
    t.tmp_path = dir + "/." + file_name(step) + ".tmp";
    t.final_path = dir + "/" + file_name(step);
    return t;
  }

  bool levels_on() const noexcept { return opt_.levels.enabled(); }
  // The run directory's record of the newest step flushed to it (levels).
  std::string flush_record_path() const { return dir_ + "/" + opt_.prefix + "-flushed"; }

  // The constructor's checks of the level options; returns this rank's node label.
  int check_levels() const {
    const char* op = "Checkpointer";
    const CheckpointLevelOptions& l = opt_.levels;
    DTRAIN_REQUIRE(
        strategy_ == CheckpointStrategy::rank0 && !opt_.async && restore_ == RestoreStrategy::rank0,
        op,
        "checkpoint levels need the rank0 write and restore strategies without async "
        "(the node-local file is written by rank 0 and flushed in the background)");
    DTRAIN_REQUIRE(l.local_every >= 0, op, "levels.local_every must be >= 0");
    DTRAIN_REQUIRE(l.shared_every >= 0, op, "levels.shared_every must be >= 0");
    DTRAIN_REQUIRE(l.transfer_timeout_seconds > 0, op,
                   "levels.transfer_timeout_seconds must be > 0");
    const int label = detail::ckpt_node_label(comm_, l.node);
    DTRAIN_REQUIRE(label >= 0, op,
                   "checkpoint levels: this communicator does not say which node a rank is on "
                   "(no transport().node_map()); set CheckpointLevelOptions::node");
    return label;
  }

  // Collective: the node-local save (rank 0 writes into its node's directory), the partner
  // copy (rank 0 sends the file to the next node's leader), and every shared_every-th time
  // the start of the background flush to the run directory.
  void save_levels(detail::CkptSaveJob& job, const detail::PartsLayout& layout, const char* op) {
    const std::int64_t step = job.m.step;
    job.target = target_in(opt_.levels.local_dir, step);
    // Which step of the run directory this copy follows: a restore refuses the copy once that
    // step is gone from there (a rollback), so it never brings back what was rolled back.
    const bool flush =
        opt_.levels.shared_every > 0 && (local_saves_ + 1) % opt_.levels.shared_every == 0;
    job.m.shared_step = flush ? step : shared_step_;
    detail::save_rank0<Format>(comm_, job, op, &layout);
    std::exception_ptr err;
    if (opt_.levels.partner && nodes_.nodes() > 1) {
      const int dst = nodes_.leader[static_cast<std::size_t>(nodes_.partner(0))];
      err = detail::ckpt_transfer_file(
          comm_, 0, dst, local_path_for(step), target_in(opt_.levels.local_dir, step),
          opt_.levels.transfer_timeout_seconds, "checkpoint partner copy");
    }
    ++local_saves_;
    if (comm_.rank() == 0 && !err && opt_.levels.shared_every > 0 &&
        local_saves_ % opt_.levels.shared_every == 0) {
      try {
        if (!flusher_) flusher_ = std::make_unique<detail::CkptFlusher>();
        flusher_->submit(step, local_path_for(step), target_in(dir_, step), flush_record_path());
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
    if (flush) shared_step_ = step;
  }

  // The rank that keeps rank s's node-local part copies: the rank with s's place among its
  // node's ranks on the next node (modulo that node's ranks).
  int part_partner(int s) const {
    const int p = static_cast<int>(nodes_.node_of.size());
    const int n = nodes_.node_of[static_cast<std::size_t>(s)];
    int at = 0;
    for (int r = 0; r < s; ++r) at += nodes_.node_of[static_cast<std::size_t>(r)] == n;
    std::vector<int> next;
    for (int r = 0; r < p; ++r)
      if (nodes_.node_of[static_cast<std::size_t>(r)] == nodes_.partner(n)) next.push_back(r);
    return next[static_cast<std::size_t>(at) % next.size()];
  }
  detail::CkptTarget part_target_for(std::int64_t step, int origin) const {
    return detail::part_target(opt_.levels.local_dir, opt_.prefix, Format::extension, step, origin,
                               comm_.size(), opt_.keep_last);
  }
  void prune_parts(int origin) const {
    detail::prune_part_files(opt_.levels.local_dir, opt_.prefix, Format::extension, origin,
                             comm_.size(), opt_.keep_last);
  }

  // Collective: the levels of a save whose state is held in parts. Every rank writes its own
  // part file into its node's directory and sends it to its partner rank on the next node (one
  // transfer at a time, in rank order: two ranks at most take part in each); every
  // shared_every-th time the one-file checkpoint goes to the run directory as the rank0
  // strategy writes it (the parts streamed to rank 0, a piece at a time), before the save
  // returns, and rank 0 records the flush.
  void save_levels_parts(detail::CkptSaveJob& job, const detail::PartsLayout& layout,
                         const char* op) {
    const std::int64_t step = job.m.step;
    const int rank = comm_.rank(), p = comm_.size();
    const bool flush =
        opt_.levels.shared_every > 0 && (local_saves_ + 1) % opt_.levels.shared_every == 0;
    job.m.shared_step = flush ? step : shared_step_;
    std::exception_ptr err;
    const detail::CkptTarget own = part_target_for(step, rank);
    try {
      Timer t;
      Format::write(own.tmp_path, detail::part_manifest(job, rank));
      own.publish();
      prune_parts(rank);
      DTRAIN_LOG(debug,
                 "checkpoint part " << own.final_path << " written in " << t.millis() << " ms");
    } catch (...) {
      err = std::current_exception();
      detail::remove_file_quietly(own.tmp_path);
    }
    detail::ckpt_agree(comm_, err, op);
    if (opt_.levels.partner && nodes_.nodes() > 1) {
      for (int s = 0; s < p; ++s) {
        const int dst = part_partner(s);
        std::exception_ptr e = detail::ckpt_transfer_file(
            comm_, s, dst, part_target_for(step, s).final_path, part_target_for(step, s),
            opt_.levels.transfer_timeout_seconds, "checkpoint partner copy");
        if (!e && rank == dst && rank != s) {
          try {
            prune_parts(s);
          } catch (...) {
            e = std::current_exception();
          }
        }
        if (e && !err) err = e;
      }
      detail::ckpt_agree(comm_, err, op);
    }
    ++local_saves_;
    if (!flush) return;
    job.target.dir = dir_;
    job.target.tmp_path = temp_path_for(step);
    job.target.final_path = path_for(step);
    job.m.shared_step = step;
    detail::save_rank0<Format>(comm_, job, op, &layout);
    if (rank == 0) {
      try {
        detail::write_flush_record(flush_record_path(), step, op);
      } catch (...) {
        err = std::current_exception();
      }
    }
    detail::ckpt_agree(comm_, err, op);
    shared_step_ = step;
  }

  // Collective: restores the newest complete set of node-local part files of this run on this
  // number of ranks, not older than the run directory's newest checkpoint: each rank's own file,
  // or its partner's copy sent back to it (written into its node's directory) where its node
  // lost it. Each rank verifies its own file and checks the run identity and rollback rules as
  // for one-file copies; a set that fails on any rank is passed over (damaged files renamed
  // .damaged, refused ones .stale, and after a rollback every later part file set aside). The
  // objects load from each rank's own file: tensors held in parts that the object holds in the
  // same parts without any collective, the rest from its reader by broadcast. std::nullopt when
  // no set qualifies (the caller goes on with the one-file levels).
  template <class... Ts>
  std::optional<std::int64_t> restore_parts(const Named<Ts>&... objects) {
    const char* op = "checkpoint restore";
    const int rank = comm_.rank(), p = comm_.size();
    const char* ext = Format::extension;
    // The run directory's steps and the newest it received, on every rank.
    std::vector<std::int64_t> shared_steps, head{0, -1};
    {
      std::exception_ptr e;
      if (rank == 0) {
        try {
          for (const auto& f : detail::list_checkpoint_files(dir_, opt_.prefix, ext))
            shared_steps.push_back(f.step);
          head[1] = detail::read_flush_record(flush_record_path(), op);
        } catch (...) {
          e = std::current_exception();
        }
        head[0] = static_cast<std::int64_t>(shared_steps.size());
      }
      detail::ckpt_agree(comm_, e, op);
      detail::ckpt_bcast_i64(comm_, head, 0);
      shared_steps.resize(static_cast<std::size_t>(head[0]));
      if (head[0] > 0) detail::ckpt_bcast_i64(comm_, shared_steps, 0);
    }
    const std::int64_t flushed = head[1];
    const std::int64_t newest_shared =
        shared_steps.empty() ? -1 : *std::max_element(shared_steps.begin(), shared_steps.end());
    auto set_aside = [](const std::string& path, const char* suffix) {
      try {
        detail::rename_path(path, path + suffix, "checkpoint restore");
      } catch (const std::exception& e) {
        DTRAIN_LOG(warn, e.what());
      }
    };
    bool purged = false;
    // A second pass when a part was damaged or could not be moved: the damaged files are set
    // aside by then, so that the copies elsewhere are taken.
    for (int pass = 0; pass < 2; ++pass) {
      bool retry = false;
      // What each node's leader holds: (step, origin) of part files of this world size.
      std::vector<unsigned char> mine;
      if (nodes_.is_leader(rank))
        for (const auto& f : detail::list_part_files(opt_.levels.local_dir, opt_.prefix, ext)) {
          if (f.of != p) continue;
          const std::int64_t v[2] = {f.step, f.origin};
          const auto* b = reinterpret_cast<const unsigned char*>(v);
          mine.insert(mine.end(), b, b + sizeof v);
        }
      const auto held = detail::ckpt_gather_blobs(comm_, mine, /*to_all=*/false);
      // Rank 0: the complete sets, newest first, with the node each part comes from (its own
      // node where it is there, else its partner node, else any); -> [count, (step, node per
      // rank)...] on every rank.
      std::vector<std::int64_t> plan{0};
      if (rank == 0) {
        std::map<std::int64_t, std::vector<std::vector<int>>> where;  // step -> origin -> nodes
        for (int n = 0; n < nodes_.nodes(); ++n) {
          const auto& blob =
              held[static_cast<std::size_t>(nodes_.leader[static_cast<std::size_t>(n)])];
          for (std::size_t i = 0; i + 16 <= blob.size(); i += 16) {
            std::int64_t v[2];
            std::memcpy(v, blob.data() + i, 16);
            auto& w = where[v[0]];
            w.resize(static_cast<std::size_t>(p));
            w[static_cast<std::size_t>(v[1])].push_back(n);
          }
        }
        for (auto it = where.rbegin(); it != where.rend(); ++it) {
          if (it->first < newest_shared) break;
          const auto& w = it->second;
          if (std::any_of(w.begin(), w.end(), [](const auto& v) { return v.empty(); })) continue;
          ++plan[0];
          plan.push_back(it->first);
          for (int o = 0; o < p; ++o) {
            const auto& v = w[static_cast<std::size_t>(o)];
            const int home = nodes_.node_of[static_cast<std::size_t>(o)];
            const int away = nodes_.partner(home);
            plan.push_back(std::find(v.begin(), v.end(), home) != v.end()   ? home
                           : std::find(v.begin(), v.end(), away) != v.end() ? away
                                                                            : v.front());
          }
        }
      }
      {
        std::vector<std::int64_t> n{static_cast<std::int64_t>(plan.size())};
        detail::ckpt_bcast_i64(comm_, n, 0);
        plan.resize(static_cast<std::size_t>(n[0]));
        detail::ckpt_bcast_i64(comm_, plan, 0);
      }
      for (std::int64_t k = 0; k < plan[0]; ++k) {
        const std::size_t at = 1 + static_cast<std::size_t>(k) * (1 + static_cast<std::size_t>(p));
        const std::int64_t step = plan[at];
        if (purged && step > newest_shared) continue;
        // Parts whose node lost them come back from the node holding a copy.
        int verdict = 0;  // 0 usable, 1 damaged or missing, 2 refused, 3 refused: rolled back
        int from_node = -1;
        for (int o = 0; o < p; ++o) {
          const int n = static_cast<int>(plan[at + 1 + static_cast<std::size_t>(o)]);
          if (n == nodes_.node_of[static_cast<std::size_t>(o)]) continue;
          if (from_node < 0) from_node = n;
          const int src = nodes_.leader[static_cast<std::size_t>(n)];
          std::exception_ptr e = detail::ckpt_transfer_file(
              comm_, src, o, part_target_for(step, o).final_path, part_target_for(step, o),
              opt_.levels.transfer_timeout_seconds, "checkpoint restore from a partner copy");
          if (e && (rank == o || rank == src))
            DTRAIN_LOG(warn, "the partner copy of rank "
                                 << o << "'s part of step " << step << " on node " << n
                                 << " could not be used: " << detail::classify(e).second);
          if (e && rank == o) verdict = 1;
        }
        const std::string path = part_target_for(step, rank).final_path;
        detail::CkptManifest m;
        std::exception_ptr fatal;
        if (verdict == 0) {
          try {
            m = Format::verify(path);
            if (m.step != step || m.world_size != p)
              raise<IoError>(
                  op, detail::concat(path, " holds step ", m.step, " of ", m.world_size, " ranks"));
            const std::string why =
                detail::copy_refusal(m.run_id, m.shared_step, run_id_, shared_steps, flushed);
            if (!why.empty()) {
              DTRAIN_LOG(warn, "not restoring the node-local part file "
                                   << path << ": " << why << "; renamed to " << path << ".stale");
              set_aside(path, ".stale");
              verdict = m.run_id == run_id_ && m.step > newest_shared ? 3 : 2;
            }
          } catch (const IoError& e) {
            DTRAIN_LOG(warn, "skipping damaged node-local part file " << path << ": " << e.what()
                                                                      << "; renamed to " << path
                                                                      << ".damaged");
            set_aside(path, ".damaged");
            verdict = 1;
          } catch (...) {
            fatal = std::current_exception();
          }
        }
        detail::ckpt_agree(comm_, fatal, op);
        const std::int64_t worst = detail::ckpt_allreduce_i64(comm_, verdict, ReduceOp::max);
        if (worst == 3 && !purged) {
          // The run directory was rolled back: no part file of a later step is restored, on any
          // node (the rolled-back run wrote them).
          purged = true;
          if (nodes_.is_leader(rank))
            for (const auto& f : detail::list_part_files(opt_.levels.local_dir, opt_.prefix, ext))
              if (f.step > newest_shared) {
                DTRAIN_LOG(warn, "the run directory " << dir_ << " was rolled back to step "
                                                      << newest_shared << ": renaming " << f.path
                                                      << " to " << f.path << ".stale");
                set_aside(f.path, ".stale");
              }
          if (rank == 0) {
            try {
              detail::write_flush_record(flush_record_path(), newest_shared, op);
            } catch (const std::exception& e) {
              DTRAIN_LOG(warn, e.what());
            }
          }
        }
        if (worst == 1 && pass == 0) {
          retry = true;  // the newest set again, from the copies of what is damaged or lost
          break;
        }
        if (worst != 0) continue;
        bool checked = false;
        try {
          load_parts(path, m, checked, objects...);
        } catch (const InvalidArgument& e) {
          // Refused by the check pass on every rank, nothing modified (e.g. the objects hold
          // other parts than the files): the one-file levels restore them whole where they can,
          // or report the mismatch again.
          if (checked) throw;
          if (rank == 0)
            DTRAIN_LOG(warn, "the node-local part files of step "
                                 << step << " do not fit the objects (" << e.what()
                                 << "): restoring from the other levels");
          return std::nullopt;
        }
        shared_step_ = std::min(m.shared_step, flushed);
        restored_level_ = from_node < 0 ? CheckpointLevel::local : CheckpointLevel::partner;
        restored_node_ = from_node < 0 ? 0 : from_node;
        mark_saved(step);
        if (rank == 0)
          DTRAIN_LOG(info, "restored step "
                               << step << " from the node-local part files of the " << p << " ranks"
                               << (from_node < 0 ? std::string()
                                                 : " (some sent back from node " +
                                                       std::to_string(from_node) + ")"));
        return step;
      }
      if (!retry) break;
    }
    return std::nullopt;
  }

  // Collective: the objects from each rank's verified part file `path` (manifest `pm`); `checked`
  // turns true once every rank found that the objects match (a later failure may have modified
  // them).
  template <class... Ts>
  void load_parts(const std::string& path, const detail::CkptManifest& pm, bool& checked,
                  const Named<Ts>&... objects) {
    const char* op = "checkpoint restore";
    const int rank = comm_.rank(), p = comm_.size();
    std::unique_ptr<typename Format::Reader> reader;
    detail::PartFileView view;
    std::exception_ptr err;
    try {
      reader = std::make_unique<typename Format::Reader>(path);
      view = detail::read_part_layouts(
          pm, rank, path, [&](const detail::CkptEntry& l, void* dst) { reader->read(l, dst); });
    } catch (...) {
      err = std::current_exception();
    }
    detail::ckpt_agree(comm_, err, op);
    // The restore's metadata on every rank: rank 0's replicated entries not held in parts, this
    // rank's tensors held in parts (whole shape, its parts) and its per-rank entries.
    const std::string group = std::string(detail::kHeldPartsGroup) + "/";
    auto replicated = [&](const detail::CkptEntry& e) {
      return e.owner < 0 && e.path.compare(0, group.size(), group) != 0 &&
             !view.parts.count(e.path);
    };
    detail::CkptManifest m;
    m.step = pm.step;
    m.world_size = pm.world_size;
    m.library_version = pm.library_version;
    m.strategy = pm.strategy;
    m.run_id = pm.run_id;
    m.shared_step = pm.shared_step;
    {
      detail::BlobWriter w;
      if (rank == 0) {
        std::int64_t n = 0;
        for (const auto& e : pm.entries) n += replicated(e);
        w.put_i64(n);
        for (const auto& e : pm.entries)
          if (replicated(e)) detail::encode_entry(w, e, false);
      }
      detail::ckpt_bcast_bytes(comm_, w.bytes(), 0);
      detail::BlobReader r(w.bytes().data(), w.bytes().size());
      const auto n = r.get_i64();
      for (std::int64_t i = 0; i < n; ++i) m.entries.push_back(detail::decode_entry(r));
    }
    for (const auto& e : view.held) m.entries.push_back(e);
    for (const auto& e : pm.entries)
      if (e.owner == rank) m.entries.push_back(e);
    // Every rank's parts of each tensor held in parts (by path, the same tensors in every file:
    // they were saved from the same objects), for objects that load them whole.
    std::vector<unsigned char> own;
    for (const auto& [tpath, saved] : view.parts) {
      std::vector<std::int64_t> v{static_cast<std::int64_t>(saved.size())};
      for (const auto& s : saved) {
        v.push_back(static_cast<std::int64_t>(s.first));
        v.push_back(static_cast<std::int64_t>(s.count));
        v.push_back(static_cast<std::int64_t>(s.crc));
      }
      const auto* b = reinterpret_cast<const unsigned char*>(v.data());
      own.insert(own.end(), b, b + v.size() * sizeof(std::int64_t));
    }
    const auto lists = detail::ckpt_gather_blobs(comm_, own, true);
    detail::CkptReadPlan plan;
    for (const auto& e : m.entries) {
      if (e.kind != detail::EntryKind::tensor || e.bytes() == 0 || e.sharded) continue;
      plan.runs[e.path].push_back(
          detail::CkptRun{0, element_count(e.shape), e.owner < 0 ? 0 : e.owner, e.crc});
    }
    for (int s = 0; s < p; ++s) {
      const auto& blob = lists[static_cast<std::size_t>(s)];
      std::vector<std::int64_t> v(blob.size() / sizeof(std::int64_t));
      if (!v.empty()) std::memcpy(v.data(), blob.data(), v.size() * sizeof(std::int64_t));
      std::size_t at = 0;
      for (const auto& kv : view.parts) {
        const auto k = at < v.size() ? static_cast<std::size_t>(v[at++]) : 0;
        auto& runs = plan.runs[kv.first];
        for (std::size_t j = 0; j < k && at + 3 <= v.size(); ++j, at += 3)
          if (v[at + 1] > 0)
            runs.push_back(detail::CkptRun{static_cast<std::uint64_t>(v[at]),
                                           static_cast<std::uint64_t>(v[at + 1]), s,
                                           static_cast<std::uint32_t>(v[at + 2])});
      }
    }
    for (auto& [tpath, runs] : plan.runs) {
      std::sort(runs.begin(), runs.end(), [](const detail::CkptRun& a, const detail::CkptRun& b) {
        return a.first < b.first;
      });
      plan.count += runs.size();
    }
    const typename Format::Reader* rd = reader.get();
    const detail::PartFileView* pv = &view;
    auto file_entry = [pv](const detail::CkptEntry& e) -> const detail::CkptEntry& {
      return *pv->file.at(e.path);
    };
    detail::CkptSource src;
    src.plan = &plan;
    src.checked = &checked;
    src.read_run = [rd, pv, file_entry](const detail::CkptEntry& e, const detail::CkptRun& run,
                                        void* dst) {
      std::uint64_t at = run.first;
      if (e.sharded) {
        const auto& saved = pv->parts.at(e.path);
        const auto it = std::find_if(saved.begin(), saved.end(), [&](const detail::SavedPart& s) {
          return s.first == run.first && s.count == run.count;
        });
        if (it == saved.end())
          raise<IoError>("checkpoint restore", e.path + ": a run this rank's part file lacks");
        at = it->at;
      }
      const detail::CkptEntry& f = file_entry(e);
      rd->check_since_verified(f, rd->read_run(f, at, run.count, dst), run.crc);
    };
    src.read_parts = [rd, pv, file_entry](const detail::CkptEntry& e, BufferView held,
                                          const StateParts&) {
      // The check pass found the object's parts equal to the saved ones.
      const detail::CkptEntry& f = file_entry(e);
      auto* out = static_cast<unsigned char*>(held.data);
      for (const detail::SavedPart& s : pv->parts.at(e.path)) {
        if (s.count == 0) continue;
        rd->check_since_verified(f, rd->read_run(f, s.at, s.count, out), s.crc);
        out += s.count * size_of(e.dtype);
      }
    };
    detail::restore_objects(comm_, opt_, m, path, src, objects...);
  }

  // Collective: the newest checkpoint that is complete and verified at some level, tried per
  // step, newest first: rank 0's node-local directory, then the other nodes' (partner copies,
  // copied back into rank 0's node-local directory first), then the run directory. Damaged
  // files are renamed to .damaged where they lie; node-local and partner copies that are not
  // this run's (detail::copy_refusal: another run's, or rolled back) to .stale. False when no
  // level holds a checkpoint of this run; IoError on every rank when files exist but none of
  // them is valid.
  bool choose_levels(detail::CkptChoice<Format>& c) {
    const char* op = "checkpoint restore";
    const int rank = comm_.rank();
    const char* ext = Format::extension;
    // The run directory's steps and the newest it received, on every rank: they decide whether
    // a copy may be restored, where the copy lies.
    std::vector<detail::FoundCheckpoint> shared;
    std::vector<std::int64_t> shared_steps;
    std::vector<std::int64_t> head{0, -1};  // {count, newest flushed}
    {
      std::exception_ptr e;
      if (rank == 0) {
        try {
          shared = detail::list_checkpoint_files(dir_, opt_.prefix, ext);
          head[1] = detail::read_flush_record(flush_record_path(), op);
        } catch (...) {
          e = std::current_exception();
        }
        for (const auto& f : shared) shared_steps.push_back(f.step);
        head[0] = static_cast<std::int64_t>(shared_steps.size());
      }
      detail::ckpt_agree(comm_, e, op);
      detail::ckpt_bcast_i64(comm_, head, 0);
      shared_steps.resize(static_cast<std::size_t>(head[0]));
      if (head[0] > 0) detail::ckpt_bcast_i64(comm_, shared_steps, 0);
    }
    const std::int64_t flushed = head[1];
    // Why a copy (verified, `m`) is not to be restored, or "".
    auto refusal = [&](const detail::CkptManifest& m) {
      return detail::copy_refusal(m.run_id, m.shared_step, run_id_, shared_steps, flushed);
    };
    // A copy of this run newer than every checkpoint of the run directory that follows one no
    // longer there: the run directory was rolled back.
    const std::int64_t newest_shared =
        shared_steps.empty() ? -1 : *std::max_element(shared_steps.begin(), shared_steps.end());
    auto rolled_back = [&](const detail::CkptManifest& m) {
      return m.run_id == run_id_ && m.step > newest_shared;
    };
    // What each node's leader holds (unverified, by name).
    std::vector<unsigned char> mine;
    if (nodes_.is_leader(rank))
      for (const auto& f : local_files()) {
        const auto* b = reinterpret_cast<const unsigned char*>(&f.step);
        mine.insert(mine.end(), b, b + sizeof f.step);
      }
    const auto held = detail::ckpt_gather_blobs(comm_, mine, /*to_all=*/false);
    // Rank 0 tries the candidates in order; a copy on another node is moved to rank 0 first,
    // which every rank learns from one broadcast {what, step, node} per try:
    // what 1 = node `node` sends its copy of `step`, 2 = done, found, 3 = done, none found,
    // 4 = the run directory was rolled back to `step`: every node sets its later copies aside.
    std::exception_ptr err;
    std::vector<std::int64_t> action(4, 0);
    auto set_aside = [](const std::string& path, const char* suffix = ".damaged") {
      if (std::string(suffix) == ".damaged")
        DTRAIN_LOG(warn, "renaming damaged checkpoint " << path << " to " << path << suffix);
      try {
        detail::rename_path(path, path + suffix, "checkpoint restore");
      } catch (const std::exception& e) {
        DTRAIN_LOG(warn, e.what());
      }
    };
    // A node's leader, once a rollback to `newest` is seen: copies of later steps are not restored
    // (not even those that follow a checkpoint still there: the rolled-back run wrote them) and
    // would shadow the steps the run writes again.
    auto set_aside_after = [&](std::int64_t newest) {
      for (const auto& f : local_files())
        if (f.step > newest) {
          DTRAIN_LOG(warn, "the run directory " << dir_ << " was rolled back to step " << newest
                                                << ": renaming the node-local copy " << f.path
                                                << " to " << f.path << ".stale");
          set_aside(f.path, ".stale");
        }
    };
    bool damaged = false;  // rank 0: a file of this run failed verification or a transfer
    if (rank == 0) {
      struct Try {
        std::int64_t step;
        int node;  // -1: the shared level
      };
      std::vector<Try> tries;
      std::vector<std::int64_t> steps;
      std::vector<std::vector<std::int64_t>> on_node(static_cast<std::size_t>(nodes_.nodes()));
      for (int n = 0; n < nodes_.nodes(); ++n) {
        const auto& blob =
            held[static_cast<std::size_t>(nodes_.leader[static_cast<std::size_t>(n)])];
        for (std::size_t i = 0; i + 8 <= blob.size(); i += 8) {
          std::int64_t s;
          std::memcpy(&s, blob.data() + i, 8);
          on_node[static_cast<std::size_t>(n)].push_back(s);
          steps.push_back(s);
        }
      }
      const bool any_local = !steps.empty();
      for (const auto& f : shared) steps.push_back(f.step);
      std::sort(steps.rbegin(), steps.rend());
      steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
      auto has = [](const std::vector<std::int64_t>& v, std::int64_t s) {
        return std::find(v.begin(), v.end(), s) != v.end();
      };
      for (const std::int64_t s : steps) {
        for (int k = 0; k < nodes_.nodes(); ++k)  // node 0, then its partner, then the rest
          if (has(on_node[static_cast<std::size_t>(k)], s)) tries.push_back({s, k});
        if (std::any_of(shared.begin(), shared.end(), [&](const auto& f) { return f.step == s; }))
          tries.push_back({s, -1});
      }
      if (!any_local && !shared.empty())
        DTRAIN_LOG(warn,
                   "no node-local checkpoint on any of the "
                       << nodes_.nodes()
                       << " nodes (a restart on other nodes?): falling back to the shared level "
                       << dir_);
      std::string tried;
      bool purged = false;
      auto purge = [&] {
        if (purged) return;
        purged = true;
        action = {4, newest_shared, 0, 0};
        detail::ckpt_bcast_i64(comm_, action, 0);
        set_aside_after(newest_shared);
        // The run directory received nothing after what it holds now: a flush of a step it
        // writes again that does not complete is then not taken for another rollback.
        try {
          detail::write_flush_record(flush_record_path(), newest_shared, op);
        } catch (const std::exception& e) {
          DTRAIN_LOG(warn, e.what());
        }
      };
      for (const Try& t : tries) {
        if (purged && t.node >= 0 && t.step > newest_shared) continue;  // set aside
        std::string path;
        if (t.node > 0) {
          action = {1, t.step, t.node, 0};
          detail::ckpt_bcast_i64(comm_, action, 0);
          const int src = nodes_.leader[static_cast<std::size_t>(t.node)];
          // The node's verdict on its copy: 0 it is sent, 1 damaged, 2 not to be restored,
          // 3 not to be restored: the run directory was rolled back.
          std::vector<std::int64_t> verdict{0};
          detail::ckpt_bcast_i64(comm_, verdict, src);
          if (verdict[0] != 0) {
            damaged = damaged || verdict[0] == 1;
            tried += "\n  step " + std::to_string(t.step) + " on node " + std::to_string(t.node) +
                     ": " + (verdict[0] == 1 ? "damaged" : "refused (see that rank's log)");
            if (verdict[0] == 3) purge();
            continue;
          }
          std::exception_ptr e = detail::ckpt_transfer_file(
              comm_, src, 0, std::string(), target_in(opt_.levels.local_dir, t.step),
              opt_.levels.transfer_timeout_seconds, "checkpoint restore from a partner copy");
          if (e) {
            damaged = true;
            tried += "\n  step " + std::to_string(t.step) + " on node " + std::to_string(t.node) +
                     ": " + detail::classify(e).second;
            DTRAIN_LOG(warn, "the copy of step "
                                 << t.step << " on node " << t.node
                                 << " could not be used: " << detail::classify(e).second);
            continue;
          }
          path = local_path_for(t.step);
        } else {
          path = t.node == 0 ? local_path_for(t.step) : path_for(t.step);
        }
        try {
          c.m = Format::verify(path);
          const std::string why = t.node >= 0 ? refusal(c.m) : std::string();
          if (!why.empty()) {
            DTRAIN_LOG(warn, "not restoring the node-local checkpoint "
                                 << path << " (node 0" << (t.node > 0 ? ", rebuilt from node " : "")
                                 << (t.node > 0 ? std::to_string(t.node) : std::string())
                                 << "): " << why << "; renamed to " << path << ".stale");
            tried += "\n  " + path + ": " + why;
            set_aside(path, ".stale");
            if (rolled_back(c.m)) purge();
            c.m = detail::CkptManifest{};
            continue;
          }
          c.file = path;
          restored_level_ = t.node == 0  ? CheckpointLevel::local
                            : t.node > 0 ? CheckpointLevel::partner
                                         : CheckpointLevel::shared;
          restored_node_ = t.node;
          break;
        } catch (const IoError& e) {
          DTRAIN_LOG(warn, "skipping damaged checkpoint " << path << ": " << e.what());
          tried += "\n  " + path + ": " + e.what();
          damaged = true;
          set_aside(path);
        } catch (...) {
          err = std::current_exception();
          break;
        }
      }
      if (!err && damaged && c.file.empty())
        err = std::make_exception_ptr(make_error<IoError>(
            op,
            detail::concat("no valid checkpoint at any level (node-local ", opt_.levels.local_dir,
                           ", partner copies, shared ", dir_, "); tried:", tried)));
      if (!err && !c.file.empty()) {
        try {
          c.reader = std::make_unique<typename Format::Reader>(c.file);
        } catch (...) {
          err = std::current_exception();
        }
      }
      if (!err && c.file.empty() && !tries.empty())
        DTRAIN_LOG(warn,
                   "no checkpoint of run " << run_id_ << " at any level: a fresh run" << tried);
      // The step the run's next copies follow: the restored one's, or the newest the run
      // directory received where the restored copy follows a step whose flush never completed.
      action = {c.file.empty() ? 3 : 2, static_cast<std::int64_t>(restored_level_), restored_node_,
                restored_level_ == CheckpointLevel::shared ? c.m.step
                                                           : std::min(c.m.shared_step, flushed)};
      detail::ckpt_bcast_i64(comm_, action, 0);
    } else {
      while (true) {
        detail::ckpt_bcast_i64(comm_, action, 0);
        if (action[0] == 4) {
          if (nodes_.is_leader(rank)) set_aside_after(action[1]);
          continue;
        }
        if (action[0] != 1) break;
        const std::int64_t step = action[1];
        const int node = static_cast<int>(action[2]);
        const int src = nodes_.leader[static_cast<std::size_t>(node)];
        std::string path;
        std::vector<std::int64_t> verdict{0};
        if (rank == src) {
          // Only a copy that verifies and is this run's is sent; others are set aside here.
          path = local_path_for(step);
          struct stat st {};
          if (::stat(path.c_str(), &st) != 0) {
            // Gone since it was listed (a node-local path that is one directory for several
            // nodes, and node 0 set the file aside): nothing to send, and not damage.
            DTRAIN_LOG(info, "the partner copy " << path << " is no longer there");
            verdict[0] = 2;
          }
          try {
            if (verdict[0] == 0) {
              const detail::CkptManifest m = Format::verify(path);
              const std::string why = refusal(m);
              if (!why.empty()) {
                DTRAIN_LOG(warn, "not restoring the partner copy "
                                     << path << " (node " << node << "): " << why << "; renamed to "
                                     << path << ".stale");
                set_aside(path, ".stale");
                verdict[0] = rolled_back(m) ? 3 : 2;
              }
            }
          } catch (const IoError& e) {
            DTRAIN_LOG(warn, "skipping damaged partner copy " << path << ": " << e.what());
            set_aside(path);
            verdict[0] = 1;
          } catch (const std::exception& e) {
            DTRAIN_LOG(warn, "partner copy " << path << ": " << e.what());
            verdict[0] = 1;
          }
        }
        detail::ckpt_bcast_i64(comm_, verdict, src);
        if (verdict[0] != 0) continue;
        std::exception_ptr e = detail::ckpt_transfer_file(comm_, src, 0, path, detail::CkptTarget{},
                                                          opt_.levels.transfer_timeout_seconds,
                                                          "checkpoint restore from a partner copy");
        if (e && rank == src && !path.empty())
          DTRAIN_LOG(warn, "sending " << path << " failed: " << detail::classify(e).second);
      }
      if (action[0] == 2) {
        restored_level_ = static_cast<CheckpointLevel>(action[1]);
        restored_node_ = static_cast<int>(action[2]);
      }
    }
    restored_shared_step_ = action[3];
    detail::ckpt_agree(comm_, err, op);
    if (action[0] != 2) return false;
    if (rank == 0) {
      const std::string where = restored_level_ == CheckpointLevel::local
                                    ? "the node-local level on node 0 (" + c.file + ")"
                                : restored_level_ == CheckpointLevel::partner
                                    ? "the partner copy on node " + std::to_string(restored_node_) +
                                          " (rebuilt as " + c.file + ")"
                                    : "the shared level (" + c.file + ")";
      level_text_ = where;
      if (const auto& hook = detail::ckpt_restore_hook()) hook(c.file);
    }
    return true;
  }

  void mark_saved(std::int64_t step) {
    last_saved_step_ = step;
    last_save_time_ = now_seconds();
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
    // The background write no longer reads the buffers (or has been given up on: they stay).
    if (!err) release_buffers();
    detail::ckpt_agree(comm_, err, op);
  }

  // With keep_buffers off, frees the host buffers of the save just completed.
  void release_buffers() noexcept {
    if (opt_.keep_buffers) return;
    stage_.release();
    arena_.release();
    parts_.release();
  }

  Comm& comm_;
  std::string dir_;
  CheckpointOptions opt_;
  std::string run_id_;             // the run's identity, the same on every rank
  std::int64_t shared_step_ = -1;  // newest step sent to the run directory (levels), -1: none
  std::int64_t restored_shared_step_ = -1;
  CheckpointStrategy strategy_ = CheckpointStrategy::rank0;
  RestoreStrategy restore_ = RestoreStrategy::rank0;
  std::optional<std::int64_t> last_saved_step_;
  double last_save_time_ = now_seconds();
  std::future<void> pending_;
  detail::SnapshotArena stage_;  // host side of device tensors during a save, reused
  detail::SnapshotArena arena_;  // async snapshot, reused; rank 0 only
  detail::PartsArena parts_;     // tensors assembled from the ranks' parts; rank 0 only
  bool has_pending_ = false;
  std::int64_t pending_step_ = -1;
  detail::CkptNodes nodes_;                       // with levels: every rank's node
  std::int64_t local_saves_ = 0;                  // node-local saves by this object
  std::unique_ptr<detail::CkptFlusher> flusher_;  // rank 0: copies to the shared level
  CheckpointLevel restored_level_ = CheckpointLevel::none;
  int restored_node_ = -1;
  std::string level_text_;  // rank 0: where the last restore came from, for the log
};

}  // namespace dtrain
