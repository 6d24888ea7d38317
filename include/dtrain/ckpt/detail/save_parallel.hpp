// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the parallel write strategies. Every rank creates the same objects in one MPI-IO file;
// rank r writes its own per-rank state and its own parts of tensors held in parts, and the other
// replicated tensors are written by rank 0 (parallel_rank0) or as disjoint axis-0 slices by every
// rank (parallel_slices).
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/core/io_watchdog.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/ckpt/detail/snapshot.hpp>

namespace dtrain::detail {

/// Test knob: called with the rank inside the watched write, right before the file is created
/// (tests stall one rank there). Set it before the save, clear it after.
inline std::function<void(int)>& ckpt_parallel_write_hook() {
  static std::function<void(int)> hook;
  return hook;
}

/// Collective, blocking. Every rank learns of a failure on any rank. The MPI-IO write itself has
/// the deadline `timeout_s` (IoWatchdog: the job is ended when it passes; <= 0: none); the
/// agreements around it have the communicator's.
template <class Format, class Comm>
void save_parallel(Comm& comm, CkptSaveJob& job, bool slices, double timeout_s, const char* op) {
  const int rank = comm.rank();
  fill_replicated_crcs(comm, job.repl);
  // Every rank needs every entry's metadata (all ranks create all datasets); the bytes of
  // per-rank state stay with their owner.
  std::vector<CkptEntry> all_ranks = ckpt_exchange(comm, job.mine, /*with_data=*/false, true);
  for (auto& e : all_ranks)
    if (e.owner == rank)
      for (const auto& own : job.mine)
        if (own.path == e.path) e.data = own.data;
  job.m.entries = std::move(job.repl);
  for (auto& e : all_ranks) job.m.entries.push_back(std::move(e));
  std::exception_ptr err;
  try {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", timeout_s);
    IoWatchdog watchdog(
        timeout_s,
        rank_prefix(rank) + op + ": '" + job.target.tmp_path +
            "': the parallel (MPI-IO) write did not finish within " + secs +
            " s; every one of the " + std::to_string(comm.size()) +
            " ranks takes part in its collective calls, and a rank that failed or stopped inside "
            "them (see its own error) leaves the others waiting there. A collective write cannot "
            "be cancelled, so the job is ended; the checkpoints already published are intact "
            "(deadline: CheckpointOptions::parallel_write_timeout_seconds)");
    if (const auto& hook = ckpt_parallel_write_hook()) hook(rank);
    Format::write_parallel(job.target.tmp_path, job.m, comm, slices);
  } catch (...) {
    err = std::current_exception();
  }
  ckpt_agree(comm, err, op);
  if (rank == 0) {
    try {
      job.target.publish();
    } catch (...) {
      err = std::current_exception();
    }
  }
  ckpt_agree(comm, err, op);
}

}  // namespace dtrain::detail
