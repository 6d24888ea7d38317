// dtrain: the parallel write strategies. Every rank creates the same objects in one MPI-IO file;
// rank r writes its own per-rank state, and replicated tensors are written by rank 0
// (parallel_rank0) or as disjoint axis-0 slices by every rank (parallel_slices).
#pragma once

#include <exception>
#include <utility>
#include <vector>

#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/ckpt/detail/snapshot.hpp>

namespace dtrain::detail {

/// Collective, blocking. Every rank learns of a failure on any rank.
template <class Format, class Comm>
void save_parallel(Comm& comm, CkptSaveJob& job, bool slices, const char* op) {
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
