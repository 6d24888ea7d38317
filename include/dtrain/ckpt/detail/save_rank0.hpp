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
#include <dtrain/ckpt/detail/assemble.hpp>
#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/ckpt/detail/snapshot.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Collective, blocking. Rank 0 writes and publishes the file; every rank reports a failure.
/// With `layout` (parts_in_place's), the tensors held in parts are not assembled: rank 0 writes
/// each as its parts stream in from the ranks (stream_parts), so that no rank holds more of one
/// than its parts and a piece; without it they must be assembled already (assemble_parts).
template <class Format, class Comm>
void save_rank0(Comm& comm, CkptSaveJob& job, const char* op, const PartsLayout* layout = nullptr) {
  const int rank = comm.rank(), p = comm.size();
  std::vector<CkptEntry> gathered = ckpt_exchange(comm, job.mine, /*with_data=*/true, false);
  // Every rank takes part in every entry's stream in the same order: rank 0 from inside the
  // format's writer (and for the entries a failed write did not reach, after it), the others
  // before the checksums' allreduce, which rank 0 reaches only after the data.
  std::size_t n_sharded = 0;
  for (const auto& e : job.repl) n_sharded += e.sharded ? 1 : 0;
  if (!layout) n_sharded = 0;
  std::size_t streamed = 0;
  std::vector<unsigned char> bounce;
  auto stream_rest = [&](const std::vector<CkptEntry>& entries) {
    std::size_t k = 0;
    for (const auto& e : entries) {
      if (!e.sharded || k >= n_sharded) continue;
      if (k >= streamed) stream_parts(comm, e, k, *layout, bounce, nullptr);
      ++k;
    }
    streamed = n_sharded;
  };
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
      if (n_sharded > 0)
        m.write_parts = [&](const CkptEntry& e, const PartsSink& sink) {
          DTRAIN_REQUIRE(streamed < n_sharded, op,
                         "the writer asked for more tensors held in parts than the save has");
          // A failed store still receives the rest of the entry: the senders are mid-stream.
          std::exception_ptr failed;
          const PartsSink guarded = [&](std::size_t first, std::size_t count, const void* data) {
            if (failed) return;
            try {
              sink(first, count, data);
            } catch (...) {
              failed = std::current_exception();
            }
          };
          stream_parts(comm, e, streamed++, *layout, bounce, &guarded);
          if (failed) std::rethrow_exception(failed);
        };
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
      stream_rest(m.entries);  // the other ranks wait in these broadcasts even if the write failed
      combine();  // the other ranks wait in the same allreduce even if the write failed
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  } else {
    crc_share(job.repl, n_repl, crcs, rank, p, /*skip_rank0=*/true);
    stream_rest(job.repl);
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
