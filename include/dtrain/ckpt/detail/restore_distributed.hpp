// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the distributed restore's plan and verification. Every rank reads a share of the
// checkpoint: each tensor is cut into up to p runs of elements (row-major order) of at least
// ckpt_run_bytes(), and the runs go to the ranks with the fewest bytes so far (per-rank state to
// its owner when the world size is unchanged). Verification: each rank takes the crc32c of its
// runs, one allreduce gives every rank every run's crc32c, and each tensor's runs combine to the
// checksum stored in the file, the same verdict on every rank. The loads then read the same runs
// again, a tensor's runs by their readers at once (each checked against its verified crc32c),
// and broadcast them from their readers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>

namespace dtrain::detail {

/// The smallest run worth a reader of its own: 1 MiB (a tensor of B bytes is read by
/// min(p, B / 1 MiB) ranks at once; smaller reads would cost the filesystem more than they save).
/// Test knob: tests set it small, so that every tensor is cut into runs over every rank; set it
/// before the restore (on every rank) and reset it after.
inline std::size_t& ckpt_run_bytes() {
  static std::size_t bytes = std::size_t{1} << 20;
  return bytes;
}

/// Elements [first, first + count) of a tensor entry in row-major order, read by rank `reader`;
/// `crc` is their crc32c once verified.
struct CkptRun {
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  int reader = 0;
  std::uint32_t crc = 0;
};

/// Who reads which elements of a checkpoint; the same on every rank. Tensors without elements
/// have no runs.
struct CkptReadPlan {
  std::map<std::string, std::vector<CkptRun>> runs;  // by entry path, in element order
  std::size_t count = 0;                             // runs in all
};

/// Pure. The runs of every tensor entry with elements over `p` ranks: an entry of n elements and
/// B bytes is cut into min(p, n, max(1, B / run_bytes)) runs of (nearly) equal element counts,
/// given to the ranks with the fewest bytes assigned so far (ties: the lower rank), entries taken
/// in order. With `owners_read`, per-rank state of rank r < p is one run read by r (its own
/// state).
inline CkptReadPlan plan_reads(const std::vector<CkptEntry>& entries, int p, bool owners_read,
                               std::size_t run_bytes) {
  CkptReadPlan plan;
  std::vector<std::uint64_t> assigned(static_cast<std::size_t>(p), 0);
  std::set<std::pair<std::uint64_t, int>> least;  // (bytes assigned, rank), fewest first
  for (int r = 0; r < p; ++r) least.insert({0, r});
  auto add = [&](int r, std::uint64_t bytes) {
    auto& a = assigned[static_cast<std::size_t>(r)];
    least.erase({a, r});
    a += bytes;
    least.insert({a, r});
  };
  const std::uint64_t target = std::max<std::size_t>(run_bytes, 1);
  for (const CkptEntry& e : entries) {
    if (e.kind != EntryKind::tensor || e.bytes() == 0) continue;
    const std::uint64_t n = element_count(e.shape), es = size_of(e.dtype);
    std::vector<CkptRun>& runs = plan.runs[e.path];
    if (owners_read && e.owner >= 0 && e.owner < p) {
      runs.push_back(CkptRun{0, n, e.owner, 0});
      add(e.owner, n * es);
    } else {
      const std::uint64_t k = std::min<std::uint64_t>(
          {static_cast<std::uint64_t>(p), n, std::max<std::uint64_t>(1, n * es / target)});
      std::vector<int> readers;
      for (auto it = least.begin(); readers.size() < k; ++it) readers.push_back(it->second);
      for (std::uint64_t j = 0; j < k; ++j) {
        const std::uint64_t first = n * j / k, last = n * (j + 1) / k;
        runs.push_back(CkptRun{first, last - first, readers[j], 0});
        add(readers[j], (last - first) * es);
      }
    }
    plan.count += runs.size();
  }
  return plan;
}

/// Collective: "" when no rank has a problem, else the lowest such rank's (an error message,
/// which names its rank), the same on every rank. For outcomes every rank must act on alike
/// without throwing (a damaged checkpoint: try the next one).
template <class Comm>
std::string ckpt_first_problem(Comm& comm, const std::string& local) {
  const std::int64_t none = std::numeric_limits<std::int64_t>::max();
  const std::int64_t first =
      ckpt_allreduce_i64(comm, local.empty() ? none : comm.rank(), ReduceOp::min);
  if (first == none) return {};
  std::string what = local;
  ckpt_bcast_string(comm, what, static_cast<int>(first));
  return what;
}

/// Collective: runs `read` where `here` (a read of a checkpoint file). An IoError it throws is
/// the file's problem: returned as ckpt_first_problem (the same on every rank; "" when none), for
/// the caller to pass the file over. Any other exception is thrown on every rank (agreed).
template <class Comm, class F>
std::string ckpt_file_problem(Comm& comm, bool here, F&& read, const char* op) {
  std::string problem;
  std::exception_ptr fatal;
  if (here) {
    try {
      read();
    } catch (const IoError& e) {
      problem = e.what();
    } catch (...) {
      fatal = std::current_exception();
    }
  }
  ckpt_agree(comm, fatal, op);
  return ckpt_first_problem(comm, problem);
}

/// Collective: rank 0's manifest metadata (header, entries without data) on every rank.
template <class Comm>
void ckpt_bcast_metadata(Comm& comm, CkptManifest& m) {
  if (comm.size() == 1) return;
  BlobWriter w;
  if (comm.rank() == 0) {
    encode_header(w, m);
    w.put_i64(static_cast<std::int64_t>(m.entries.size()));
    for (const auto& e : m.entries) encode_entry(w, e, false);
  }
  ckpt_bcast_bytes(comm, w.bytes(), 0);
  if (comm.rank() == 0) return;
  BlobReader r(w.bytes().data(), w.bytes().size());
  decode_header(r, m);
  const auto n = r.get_i64();
  m.entries.clear();
  for (std::int64_t i = 0; i < n; ++i) m.entries.push_back(decode_entry(r));
}

/// A checkpoint chosen and verified for a restore: its metadata (on rank 0; distributed, on every
/// rank), the open reader (rank 0's; distributed, that of every rank with runs to read) and,
/// distributed, the plan with every run's verified crc32c.
template <class Format>
struct CkptChoice {
  std::string file;
  CkptManifest m;
  std::unique_ptr<typename Format::Reader> reader;
  CkptReadPlan plan;
  std::vector<std::string> skipped;  // damaged files passed over (newer than `file`); rank 0
};

/// Collective. Tries the files of rank 0's `candidates` (newest first; ignored elsewhere) in
/// order: rank 0 reads the metadata (Format::describe), every rank checks the checksums of its
/// runs (Format::Reader::run_crc), and the first file whose every tensor matches is chosen.
/// A damaged file (IoError from rank 0's metadata read or from any rank's reads, or a tensor
/// whose runs do not combine to its checksum) is logged by rank 0 and passed over; with
/// `fallback` false the first damaged file throws IoError on every rank instead. Returns false
/// (choice empty) when there are no candidates; throws IoError on every rank when none is
/// valid. A rank that cannot open a file whose metadata rank 0 read, and any error other than
/// IoError, throw on every rank (agreed).
template <class Format, class Comm>
bool choose_distributed(Comm& comm, const std::vector<std::string>& candidates, bool fallback,
                        const std::string& dir, CkptChoice<Format>& out) {
  const char* op = "checkpoint restore";
  const int rank = comm.rank(), p = comm.size();
  std::vector<std::string> files = candidates;
  {
    BlobWriter w;
    if (rank == 0) {
      w.put_i64(static_cast<std::int64_t>(files.size()));
      for (const auto& f : files) w.put_str(f);
    }
    ckpt_bcast_bytes(comm, w.bytes(), 0);
    BlobReader r(w.bytes().data(), w.bytes().size());
    const auto n = r.get_i64();
    files.clear();
    for (std::int64_t i = 0; i < n; ++i) files.push_back(r.get_str());
  }
  std::string tried;
  for (const std::string& file : files) {
    CkptManifest m;
    std::string problem = ckpt_file_problem(
        comm, rank == 0, [&] { m = Format::describe(file); }, op);
    std::unique_ptr<typename Format::Reader> reader;
    CkptReadPlan plan;
    if (problem.empty()) {
      ckpt_bcast_metadata(comm, m);
      plan = plan_reads(m.entries, p, m.world_size == p, ckpt_run_bytes());
      // Only ranks with runs to read open the file (at most total bytes / ckpt_run_bytes() plus
      // the tensor count, however many ranks the job has).
      bool reads = false;
      for (const auto& [path, runs] : plan.runs)
        for (const CkptRun& run : runs) reads = reads || run.reader == rank;
      std::exception_ptr fatal;
      try {
        if (reads) reader = std::make_unique<typename Format::Reader>(file);
      } catch (const IoError& e) {
        fatal = std::make_exception_ptr(
            make_error<IoError>(op, std::string(e.what()) +
                                        " (rank 0 read its metadata: a distributed restore "
                                        "needs the run directory " +
                                        dir + " on a filesystem every rank sees)"));
      } catch (...) {
        fatal = std::current_exception();
      }
      ckpt_agree(comm, fatal, op);
      // This rank's runs, checked in pieces; every run's crc32c to every rank.
      std::vector<std::int64_t> crcs(plan.count, 0);
      problem = ckpt_file_problem(
          comm, true,
          [&] {
            std::size_t slot = 0;
            for (const CkptEntry& e : m.entries) {
              const auto it = plan.runs.find(e.path);
              if (it == plan.runs.end()) continue;
              for (const CkptRun& run : it->second) {
                if (run.reader == rank) crcs[slot] = reader->run_crc(e, run.first, run.count);
                ++slot;
              }
            }
          },
          op);
      if (problem.empty() && !crcs.empty() && p > 1)
        comm.allreduce(BufferView(crcs.data(), crcs.size(), DType::i64), ReduceOp::sum);
      std::size_t slot = 0;
      for (const CkptEntry& e : m.entries) {
        const auto it = plan.runs.find(e.path);
        if (problem.empty() && it != plan.runs.end()) {
          std::uint32_t whole = 0;
          for (CkptRun& run : it->second) {
            run.crc = static_cast<std::uint32_t>(crcs[slot++]);
            whole = crc32c_combine(whole, run.crc, run.count * size_of(e.dtype));
          }
          if (whole != e.crc) {
            char buf[96];
            std::snprintf(buf, sizeof buf,
                          ": checksum mismatch (stored crc32c %08x, data gives %08x)", e.crc,
                          whole);
            problem = make_error<IoError>("checkpoint read", file + ":" + e.path + buf).what();
          }
        }
      }
    }
    if (problem.empty()) {
      out.file = file;
      out.m = std::move(m);
      out.reader = std::move(reader);
      out.plan = std::move(plan);
      return true;
    }
    if (!fallback) raise<IoError>(op, problem);
    if (rank == 0) DTRAIN_LOG(warn, "skipping damaged checkpoint " << file << ": " << problem);
    tried += "\n  " + file + ": " + problem;
    out.skipped.push_back(file);
  }
  if (!files.empty()) raise<IoError>(op, "no valid checkpoint in " + dir + "; tried:" + tried);
  return false;
}

}  // namespace dtrain::detail
