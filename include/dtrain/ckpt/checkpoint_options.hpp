// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the settings of a Checkpointer, its write strategies and its checkpoint levels. Plain
// data; the levels and the run identity are read from the environment (<dtrain/core/env.hpp>)
// by the Checkpointer unless CheckpointOptions::read_env is off.
#pragma once

#include <cstdint>
#include <string>

#include <dtrain/core/env.hpp>

namespace dtrain {

/// Who writes what. Per-rank state always ends up in the same file as the replicated state.
/// Tensors held in parts over the ranks (a sharded optimizer state) are assembled on rank 0 by
/// rank0; the MPI-IO strategies have every rank write its own parts in place.
enum class CheckpointStrategy : unsigned char {
  automatic,        ///< the measured fastest that the communicator and options allow (rank0)
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

/// Who reads a checkpoint at restore. Both verify every checksum before any object is touched
/// and fall back to an older file when the newest is damaged; they differ in who reads.
enum class RestoreStrategy : unsigned char {
  /// distributed when the write strategy is an MPI-IO one (the run directory is then on a
  /// filesystem every rank sees), rank0 otherwise
  automatic,
  /// rank 0 verifies the file and reads it; tensors reach the other ranks by broadcast and
  /// per-rank state is sent to its owner. The run directory need be visible to rank 0 only.
  rank0,
  /// every rank verifies and reads a share of the file (each tensor in up to p runs of at least
  /// 1 MiB, balanced over the ranks), broadcasts what it read of replicated tensors, and reads its
  /// own per-rank state: rank 0 reads about 1/p of the file instead of all of it, twice
  /// (verification, then the loads). Ranks with runs open the file: the run directory must be
  /// on a filesystem every rank sees.
  distributed,
};

constexpr const char* name_of(RestoreStrategy s) noexcept {
  switch (s) {
    case RestoreStrategy::automatic: return "automatic";
    case RestoreStrategy::rank0: return "rank0";
    case RestoreStrategy::distributed: return "distributed";
  }
  return "?";
}

/// Multi-level checkpoints (docs/checkpoints.md, "Multi-level checkpoints"): every save goes to a
/// node-local directory first (level 1), is copied to the next node's local directory (level 2,
/// the partner copy) and every `shared_every`-th one is copied to the run directory by a
/// background thread (level 3, the shared level). Off while `local_dir` is empty. Plain data.
struct CheckpointLevelOptions {
  /// The node-local directory (tmpfs such as /dev/shm/<job>, local NVMe, $TMPDIR): the same path
  /// names a different directory on every node. Never guessed: empty = levels off, every save
  /// goes to the run directory as before.
  std::string local_dir;
  /// maybe_save saves (to the node-local level) when step % local_every == 0 (0: only as
  /// every_steps / every_seconds say).
  std::int64_t local_every = 0;
  /// Also write every node-local checkpoint into the local directory of the next node (node
  /// n + 1, the last node's partner is node 0), so that a lost node never takes the only copy
  /// with it. Without effect on one node.
  bool partner = true;
  /// Copy every shared_every-th node-local save to the run directory (the shared level), in the
  /// background (0: never).
  int shared_every = 1;
  /// This rank's node (any label; equal labels = one node, numbered in the order of their lowest
  /// rank). -1: the communicator's own grouping, comm.transport().node_map() (real hostnames, or
  /// DTRAIN_RANKS_PER_NODE's fake nodes); a communicator without one needs it set.
  int node = -1;
  /// Deadline of each partner transfer (sending or receiving one checkpoint file), seconds.
  double transfer_timeout_seconds = 600;

  /// These settings, overridden by DTRAIN_CKPT_LOCAL_DIR, DTRAIN_CKPT_LOCAL_EVERY (0 .. 2^62),
  /// DTRAIN_CKPT_PARTNER (boolean) and DTRAIN_CKPT_SHARED_EVERY (0 .. 2^30) where they are set,
  /// parsed strictly (InvalidArgument naming the variable).
  CheckpointLevelOptions with_env() const {
    CheckpointLevelOptions c = *this;
    if (const auto v = env::get("DTRAIN_CKPT_LOCAL_DIR")) c.local_dir = *v;
    c.local_every = env::get_int("DTRAIN_CKPT_LOCAL_EVERY", c.local_every, 0, 1ll << 62);
    c.partner = env::get_bool("DTRAIN_CKPT_PARTNER", c.partner);
    c.shared_every =
        static_cast<int>(env::get_int("DTRAIN_CKPT_SHARED_EVERY", c.shared_every, 0, 1 << 30));
    return c;
  }
  /// The defaults overridden by the environment (with_env).
  static CheckpointLevelOptions from_env() { return CheckpointLevelOptions{}.with_env(); }
  bool enabled() const noexcept { return !local_dir.empty(); }
};

/// Settings of a Checkpointer. Plain data.
struct CheckpointOptions {
  std::int64_t every_steps = 0;  ///< maybe_save saves when step % every_steps == 0 (0: never)
  double every_seconds = 0;  ///< ... or when this much time passed since the last save (0: never)
  int keep_last = 3;         ///< valid checkpoints kept in the run directory (>= 1)
  bool async = false;        ///< write from a host snapshot on a background thread
  std::string config;        ///< stored verbatim in every file (e.g. the run's configuration)
  CheckpointStrategy strategy = CheckpointStrategy::automatic;
  RestoreStrategy restore = RestoreStrategy::automatic;  ///< who reads a checkpoint at restore
  std::string prefix = "ckpt";  ///< files are <prefix>-<step, 12 digits>.h5
  /// Restoring on a different number of ranks always restores replicated state; per-rank
  /// objects are then an error unless this is set, in which case they keep their current state.
  bool reset_per_rank_on_resize = false;
  /// Keep a save's host buffers for the next save (device tensors' download on every rank; on
  /// rank 0 the asynchronous snapshot, with the tensors assembled from the ranks' parts for it,
  /// each as large as what it holds): a later save costs copies, not fresh page faults. false:
  /// release them when the save is complete (a synchronous save on return; an asynchronous one when
  /// its write is waited for: the next save, wait()), for ranks whose memory matters more than the
  /// save's time, e.g. rank 0 of a run whose optimizer state is sharded to save memory.
  bool keep_buffers = true;
  /// Deadline for waiting on a background write.
  double wait_timeout_seconds = 3600;
  /// Deadline of one parallel (MPI-IO) write (parallel_rank0, parallel_slices). Its collective
  /// calls cannot be cancelled: when a rank fails or stops inside them, the others would wait
  /// there for the rest of the allocation. At the deadline a waiting rank prints what it waited
  /// for and ends the job (MPI_Abort through the transport's abort hook); the checkpoints already
  /// published are intact. <= 0: no deadline.
  double parallel_write_timeout_seconds = 3600;
  /// Node-local, partner and shared levels (off unless levels.local_dir is set).
  CheckpointLevelOptions levels;
  /// The run's identity, recorded in every file (docs/checkpoints.md, "Run identity"). Empty:
  /// the run directory's own, read from <run_dir>/dtrain-run-id, or created there by the first
  /// Checkpointer of the run. Set: this identity is adopted (written to that file), to continue
  /// on purpose from node-local copies of another run. 1 to 128 characters of [A-Za-z0-9._:-].
  /// Only rank 0's value counts.
  std::string run_id;
  /// The constructor applies the environment over these options: DTRAIN_CKPT_LOCAL_DIR and its
  /// siblings over `levels` (CheckpointLevelOptions::with_env) and DTRAIN_CKPT_RUN_ID over
  /// `run_id`, where they are set, so that a batch script reaches every program that
  /// checkpoints. false: the options exactly as given.
  bool read_env = true;

  /// These options with the environment applied as the constructor applies it (read_env).
  CheckpointOptions with_env() const {
    CheckpointOptions c = *this;
    c.levels = levels.with_env();
    if (const auto v = env::get("DTRAIN_CKPT_RUN_ID")) c.run_id = *v;
    return c;
  }
};

}  // namespace dtrain
