// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the settings of a Checkpointer and its write strategies. Plain data, no dependencies.
#pragma once

#include <cstdint>
#include <string>

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
  /// rank 0 the tensors assembled from the ranks' parts by rank0 and the asynchronous snapshot,
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
};

}  // namespace dtrain
