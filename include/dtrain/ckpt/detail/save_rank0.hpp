// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the rank0 write strategy. Per-rank state is gathered to rank 0, which writes the whole
// file alone with the format's serial writer, either now (the other ranks compute the
// checksums meanwhile) or from a host snapshot on a background thread (async).
#pragma once

#include <exception>
#include <future>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/ckpt/detail/snapshot.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Collective, blocking. Rank 0 writes and publishes the file; every rank reports a failure.
template <class Format, class Comm>
void save_rank0(Comm& comm, CkptSaveJob& job, const char* op) {
  const int rank = comm.rank(), p = comm.size();
  std::vector<CkptEntry> gathered = ckpt_exchange(comm, job.mine, /*with_data=*/true, false);
  // Checksums are computed while rank 0 writes the data: by the other ranks (p > 1) or by a
  // helper thread (p == 1), and combined just before rank 0 stores them.
  std::vector<std::int64_t> crcs(job.repl.size(), 0);
  const std::size_t n_repl = job.repl.size();
  std::vector<CkptEntry>* target = &job.repl;
  bool combined = false;
  std::future<void> helper;
  auto combine = [&] {
    if (combined) return;
    combined = true;
    if (helper.valid()) helper.get();
    if (p > 1 && !crcs.empty())
      comm.allreduce(BufferView(crcs.data(), crcs.size(), DType::i64), ReduceOp::sum);
    for (std::size_t i = 0; i < n_repl; ++i) (*target)[i].crc = static_cast<std::uint32_t>(crcs[i]);
  };
  std::exception_ptr err;
  if (rank == 0) {
    CkptManifest& m = job.m;
    try {
      m.entries = std::move(job.repl);
      target = &m.entries;
      for (auto& e : gathered) m.entries.push_back(std::move(e));
      parts_crcs(m.entries, n_repl, crcs, rank);
      if (p == 1)
        helper = std::async(std::launch::async, [&, rank] {
          RankScope scope(rank);
          crc_share(m.entries, n_repl, crcs, rank, p, /*skip_rank0=*/false);
        });
      m.before_checksums = combine;
      Timer phase;
      Format::write(job.target.tmp_path, m);
      const double write_ms = phase.millis();
      phase.reset();
      job.target.publish();
      DTRAIN_LOG(debug, "checkpoint " << job.target.final_path << ": write+fsync " << write_ms
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
    crc_share(job.repl, n_repl, crcs, rank, p, /*skip_rank0=*/true);
    combine();
  }
  ckpt_agree(comm, err, op);
}

/// Collective (the gather), then local: rank 0 copies everything into `arena` and returns the
/// background write (checksums, file, publish); the other ranks return an empty future. The
/// write's errors surface when the future is read.
template <class Format, class Comm>
std::future<void> save_rank0_async(Comm& comm, CkptSaveJob& job, SnapshotArena& arena) {
  const int rank = comm.rank();
  std::vector<CkptEntry> gathered = ckpt_exchange(comm, job.mine, /*with_data=*/true, false);
  if (rank != 0) return {};
  CkptManifest m = std::move(job.m);
  m.entries = std::move(job.repl);
  for (auto& e : gathered) m.entries.push_back(std::move(e));
  arena.take({&m.entries}, SnapshotOf::caller_memory);
  return std::async(std::launch::async, [m = std::move(m), target = job.target, rank]() mutable {
    RankScope scope(rank);
    for (auto& e : m.entries)
      if (e.kind == EntryKind::tensor && e.owner < 0) e.crc = crc32c(e.data, e.bytes());
    Format::write(target.tmp_path, m);
    target.publish();
  });
}

}  // namespace dtrain::detail
