// SPDX-License-Identifier: BSD-3-Clause
// dtrain: tensors held in parts over the ranks (the state protocol's tensor_parts: a sharded
// optimizer state) made ready for a checkpoint write. For rank 0's write they are assembled on
// rank 0 (assemble_parts): every rank's list of parts reaches every rank at once (allgather where
// the communicator has it); the bytes reach rank 0 through the communicator's broadcast, in
// pieces of bounded size (large parts straight into place on rank 0); rank 0 places them, checks
// that the parts cover every element exactly once, and combines the checksums each rank took of
// its own parts. For a parallel write every rank writes its own parts (parts_in_place: only the
// lists are exchanged and checked). Either way the file holds the same dataset as the whole
// tensor's, so a checkpoint written from parts restores into any run, sharded or not, on any
// number of ranks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::detail {

/// Bytes one broadcast of a rank's parts moves at most (the receivers' bounce buffer).
inline constexpr std::size_t kAssemblePieceBytes = std::size_t{4} << 20;

/// Rank 0's host buffer for assembled tensors, kept between saves (a later save costs copies,
/// not fresh page faults). Local; owned by one Checkpointer.
class PartsArena {
 public:
  unsigned char* reserve(std::size_t bytes) {
    if (bytes > bytes_) {
      buf_.reset();
      buf_.reset(new unsigned char[bytes]);
      bytes_ = bytes;
    }
    return buf_.get();
  }
  /// Frees the buffer (the entries pointed into it must no longer be read).
  void release() noexcept {
    buf_.reset();
    bytes_ = 0;
  }
  /// Bytes held for the next save.
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::unique_ptr<unsigned char[]> buf_;
  std::size_t bytes_ = 0;
};

/// One rank's part of a tensor: first element, count, the rank, the part's crc32c.
struct HeldPart {
  std::size_t first = 0, count = 0;
  int rank = 0;
  std::uint32_t crc = 0;
};

/// The first gap or overlap in `held` over n elements, as a sentence; empty when the parts
/// cover every element exactly once. Sorts `held` by first element. Pure.
inline std::string parts_coverage_problem(std::vector<HeldPart>& held, std::size_t n) {
  std::sort(held.begin(), held.end(), [](const HeldPart& a, const HeldPart& b) {
    return a.first != b.first ? a.first < b.first : a.count < b.count;
  });
  std::size_t end = 0;
  int last = -1;
  for (const HeldPart& h : held) {
    if (h.count == 0) continue;
    if (h.first > end)
      return "elements [" + std::to_string(end) + ", " + std::to_string(h.first) +
             ") are held by no rank";
    if (h.first < end)
      return "elements [" + std::to_string(h.first) + ", " +
             std::to_string(std::min(end, h.first + h.count)) + ") are held by rank " +
             std::to_string(last) + " and rank " + std::to_string(h.rank);
    end = h.first + h.count;
    last = h.rank;
  }
  if (end < n)
    return "elements [" + std::to_string(end) + ", " + std::to_string(n) + ") are held by no rank";
  return {};
}

/// The broadcasts that move a rank's held elements (its parts back to back): a part of at least
/// kAssembleDirectBytes goes alone, in pieces of at most kAssemblePieceBytes, which rank 0
/// receives in place; smaller parts go together, up to a piece, through a bounce buffer. Every
/// rank computes the same runs from the same parts. Pure.
inline constexpr std::size_t kAssembleDirectBytes = std::size_t{256} << 10;
struct PartsRun {
  std::size_t part = 0, into = 0;  // where the run starts: a part, elements into it
  std::size_t count = 0;           // elements
  bool direct = false;             // one piece of one part: rank 0 receives it in place
};
inline std::vector<PartsRun> parts_runs(const StateParts& parts, std::size_t elem_size) {
  const std::size_t piece = std::max<std::size_t>(1, kAssemblePieceBytes / elem_size);
  const std::size_t direct = std::max<std::size_t>(1, kAssembleDirectBytes / elem_size);
  std::vector<PartsRun> runs;
  std::size_t k = 0;
  while (k < parts.size()) {
    if (parts[k].second >= direct) {
      for (std::size_t into = 0; into < parts[k].second; into += piece)
        runs.push_back({k, into, std::min(piece, parts[k].second - into), true});
      ++k;
      continue;
    }
    PartsRun r{k, 0, 0, false};
    while (k < parts.size() && parts[k].second < direct && r.count + parts[k].second <= piece)
      r.count += parts[k++].second;
    runs.push_back(r);
  }
  return runs;
}

/// The entries of `repl` held in parts, in order. Local.
inline std::vector<CkptEntry*> sharded_entries(std::vector<CkptEntry>& repl) {
  std::vector<CkptEntry*> sharded;
  for (auto& e : repl)
    if (e.sharded) sharded.push_back(&e);
  return sharded;
}

/// This rank's parts of `sharded` with their checksums, per entry [count, first, n, crc, ...],
/// as bytes to exchange. Local; reads the parts (host memory).
inline std::vector<unsigned char> own_parts_list(const std::vector<CkptEntry*>& sharded) {
  std::vector<std::int64_t> mine;
  for (const CkptEntry* e : sharded) {
    mine.push_back(static_cast<std::int64_t>(e->parts.size()));
    const auto* src = static_cast<const unsigned char*>(e->data);
    const std::size_t es = size_of(e->dtype);
    for (const auto& [first, count] : e->parts) {
      mine.push_back(static_cast<std::int64_t>(first));
      mine.push_back(static_cast<std::int64_t>(count));
      mine.push_back(static_cast<std::int64_t>(crc32c(src, count * es)));
      src += count * es;
    }
  }
  std::vector<unsigned char> own(mine.size() * sizeof(std::int64_t));
  if (!own.empty()) std::memcpy(own.data(), mine.data(), own.size());
  return own;
}

/// Rank `s`'s list (own_parts_list's bytes) read back: per entry of `sharded`, its parts.
/// `inside[k]` tells whether every part of entry k lies within the tensor (a rank's list is not
/// trusted here: the coverage check names what is wrong). Local, pure.
inline std::vector<std::vector<HeldPart>> parse_parts_list(const std::vector<unsigned char>& blob,
                                                           const std::vector<CkptEntry*>& sharded,
                                                           int s, std::vector<bool>& inside) {
  std::vector<std::int64_t> list(blob.size() / sizeof(std::int64_t));
  if (!list.empty()) std::memcpy(list.data(), blob.data(), list.size() * sizeof(std::int64_t));
  std::vector<std::vector<HeldPart>> out(sharded.size());
  inside.assign(sharded.size(), true);
  std::size_t at = 0;
  for (std::size_t k = 0; k < sharded.size(); ++k) {
    const std::size_t n = element_count(sharded[k]->whole);
    const auto parts = static_cast<std::size_t>(list[at++]);
    for (std::size_t j = 0; j < parts; ++j) {
      HeldPart h;
      h.first = static_cast<std::size_t>(list[at++]);
      h.count = static_cast<std::size_t>(list[at++]);
      h.crc = static_cast<std::uint32_t>(list[at++]);
      h.rank = s;
      inside[k] = inside[k] && h.first <= n && h.count <= n - h.first;
      out[k].push_back(h);
    }
  }
  return out;
}

/// Checks that `held` (every rank's parts of entry `e`) covers each element exactly once and
/// returns the whole tensor's crc32c, combined from the parts' in element order. Throws
/// InvalidArgument naming the tensor otherwise. Local, pure (sorts `held`).
inline std::uint32_t whole_crc_of_parts(const CkptEntry& e, std::vector<HeldPart>& held, int p,
                                        const char* op) {
  const std::size_t n = element_count(e.whole), es = size_of(e.dtype);
  const std::string problem = parts_coverage_problem(held, n);
  if (!problem.empty())
    raise<InvalidArgument>(op, "tensor " + e.path + " is held in parts over the " +
                                   std::to_string(p) + " ranks, but " + problem +
                                   " (each element must be held by exactly one rank)");
  std::uint32_t crc = 0;
  for (const HeldPart& h : held) crc = crc32c_combine(crc, h.crc, h.count * es);
  return crc;
}

/// Collective, blocking. Assembles every entry of `repl` held in parts (same entries on every
/// rank: the caller has checked the structure digest) on rank 0, in `arena`: afterwards each has
/// its whole shape, its checksum (combined on rank 0 from the crc32c each rank took of its own
/// parts) and, on rank 0, its assembled bytes, marked staged; elsewhere no data. Throws on every
/// rank (agreed) InvalidArgument when the ranks' parts leave an element uncovered or cover one
/// twice, naming the tensor.
template <class Comm>
void assemble_parts(Comm& comm, std::vector<CkptEntry>& repl, PartsArena& arena, const char* op) {
  const int rank = comm.rank(), p = comm.size();
  const std::vector<CkptEntry*> sharded = sharded_entries(repl);
  if (sharded.empty()) return;
  std::vector<std::size_t> slot;  // each entry's place in rank 0's buffer (64-byte aligned)
  std::size_t total = 0;
  for (const CkptEntry* e : sharded) {
    slot.push_back(total);
    total += (element_count(e->whole) * size_of(e->dtype) + 63) / 64 * 64;
  }
  // This rank's parts with their checksums, taken before any exchange so that the ranks
  // checksum their parts at the same time.
  const std::vector<unsigned char> own = own_parts_list(sharded);
  std::exception_ptr err;
  unsigned char* whole = nullptr;
  if (rank == 0) {
    try {
      whole = arena.reserve(total);
    } catch (...) {
      err = std::current_exception();
    }
  }
  ckpt_agree(comm, err, op);

  // Every rank learns every rank's list (each takes part in every rank's broadcasts below): two
  // allgathers where the communicator has them, not one broadcast per rank.
  const std::vector<std::vector<unsigned char>> lists = ckpt_gather_blobs(comm, own, true);

  std::vector<std::vector<HeldPart>> held(sharded.size());
  std::vector<unsigned char> bounce;
  std::vector<bool> inside;
  for (int s = 0; s < p; ++s) {
    const std::vector<std::vector<HeldPart>> of_s =
        parse_parts_list(lists[static_cast<std::size_t>(s)], sharded, s, inside);
    for (std::size_t k = 0; k < sharded.size(); ++k) {
      CkptEntry& e = *sharded[k];
      const std::size_t es = size_of(e.dtype);
      StateParts parts;
      for (const HeldPart& h : of_s[k]) {
        parts.emplace_back(h.first, h.count);
        held[k].push_back(h);
      }
      unsigned char* dst = rank == 0 ? whole + slot[k] : nullptr;
      const auto* src = static_cast<const unsigned char*>(e.data);
      if (s == 0) {
        if (rank == 0 && inside[k])
          for (const auto& [first, count] : parts) {
            if (count) std::memcpy(dst + first * es, src, count * es);
            src += count * es;
          }
        continue;
      }
      // Rank s's bytes, run by run (the communicator has no point-to-point here: the ranks
      // other than s and 0 receive into the bounce buffer and drop it).
      std::size_t from = 0;  // elements of rank s's held data before the run
      for (const PartsRun& run : parts_runs(parts, es)) {
        if (run.count == 0) continue;  // empty parts only (every rank skips it)
        void* buf = nullptr;
        if (rank == s)
          buf = const_cast<unsigned char*>(src + from * es);
        else if (rank == 0 && run.direct && inside[k])
          buf = dst + (parts[run.part].first + run.into) * es;
        else {
          if (bounce.size() < run.count * es) bounce.resize(run.count * es);
          buf = bounce.data();
        }
        comm.broadcast(BufferView(buf, run.count, e.dtype), s);
        if (rank == 0 && !run.direct && inside[k]) {
          std::size_t got = 0;
          for (std::size_t q = run.part; got < run.count; ++q) {
            const std::size_t c = parts[q].second;
            if (c) std::memcpy(dst + parts[q].first * es, bounce.data() + got * es, c * es);
            got += c;
          }
        }
        from += run.count;
      }
    }
  }

  if (rank == 0) {
    try {
      for (std::size_t k = 0; k < sharded.size(); ++k) {
        CkptEntry& e = *sharded[k];
        e.crc = whole_crc_of_parts(e, held[k], p, op);
        e.data = whole + slot[k];
      }
    } catch (...) {
      err = std::current_exception();
    }
  }
  ckpt_agree(comm, err, op);
  for (CkptEntry* e : sharded) {
    e->shape = e->whole;
    e->parts.clear();
    e->device = ExecCopier{};
    e->staged = true;
    if (rank != 0) e->data = nullptr;
  }
}

/// Every rank's parts of each entry held in parts: [rank][entry], entries in `repl` order.
using PartsLayout = std::vector<std::vector<StateParts>>;

/// Collective, blocking. Prepares every entry of `repl` held in parts for a write in which no
/// rank assembles the tensor (each rank writes its own parts into the whole tensor's dataset, or
/// rank 0 writes them as they stream in: stream_parts): every rank learns every rank's parts (one
/// allgather of the lists, no tensor bytes), checks that they cover each element exactly once,
/// and sets the entry's checksum, combined from the parts' as assemble_parts does. The entries
/// keep this rank's parts and data. Returns every rank's parts. Throws on every rank (agreed)
/// InvalidArgument naming the tensor when the parts leave a gap or overlap.
template <class Comm>
PartsLayout parts_in_place(Comm& comm, std::vector<CkptEntry>& repl, const char* op) {
  const int p = comm.size();
  const std::vector<CkptEntry*> sharded = sharded_entries(repl);
  PartsLayout layout(static_cast<std::size_t>(p));
  if (sharded.empty()) return layout;
  const std::vector<std::vector<unsigned char>> lists =
      ckpt_gather_blobs(comm, own_parts_list(sharded), true);
  std::exception_ptr err;
  try {
    std::vector<std::vector<HeldPart>> held(sharded.size());
    std::vector<bool> inside;
    for (int s = 0; s < p; ++s) {
      auto of_s = parse_parts_list(lists[static_cast<std::size_t>(s)], sharded, s, inside);
      auto& mine = layout[static_cast<std::size_t>(s)];
      for (std::size_t k = 0; k < sharded.size(); ++k) {
        held[k].insert(held[k].end(), of_s[k].begin(), of_s[k].end());
        mine.emplace_back();
        for (const HeldPart& h : of_s[k]) mine.back().emplace_back(h.first, h.count);
      }
    }
    for (std::size_t k = 0; k < sharded.size(); ++k)
      sharded[k]->crc = whole_crc_of_parts(*sharded[k], held[k], p, op);
  } catch (...) {
    err = std::current_exception();
  }
  ckpt_agree(comm, err, op);
  return layout;
}

/// Receives a run of a tensor held in parts on rank 0: elements [first, first + count) in
/// row-major order, their bytes at `data` (valid during the call only).
using PartsSink = std::function<void(std::size_t first, std::size_t count, const void* data)>;

/// Collective, blocking. Moves entry `k` of the entries held in parts (`e`: this rank's entry,
/// `layout` from parts_in_place) to rank 0, rank by rank, and hands every part to `sink` on rank
/// 0 (null on the other ranks, or on rank 0 to drop the bytes after a failed write): rank 0's own
/// parts from its memory, the others' through the communicator's broadcast in pieces of at most
/// kAssemblePieceBytes, received into `bounce`. No rank holds more of the tensor than its parts
/// and one piece.
template <class Comm>
void stream_parts(Comm& comm, const CkptEntry& e, std::size_t k, const PartsLayout& layout,
                  std::vector<unsigned char>& bounce, const PartsSink* sink) {
  const int rank = comm.rank(), p = comm.size();
  const std::size_t es = size_of(e.dtype);
  for (int s = 0; s < p; ++s) {
    const StateParts& parts = layout[static_cast<std::size_t>(s)][k];
    if (s == 0) {
      if (rank == 0 && sink) {
        const auto* src = static_cast<const unsigned char*>(e.data);
        for (const auto& [first, count] : parts) {
          (*sink)(first, count, src);
          src += count * es;
        }
      }
      continue;
    }
    const auto* src = static_cast<const unsigned char*>(e.data);
    std::size_t from = 0;  // elements of rank s's held data before the run
    for (const PartsRun& run : parts_runs(parts, es)) {
      if (run.count == 0) continue;  // empty parts only (every rank skips it)
      void* buf = nullptr;
      if (rank == s) {
        buf = const_cast<unsigned char*>(src + from * es);
      } else {
        if (bounce.size() < run.count * es) bounce.resize(run.count * es);
        buf = bounce.data();
      }
      comm.broadcast(BufferView(buf, run.count, e.dtype), s);
      if (rank == 0 && sink) {
        if (run.direct) {
          (*sink)(parts[run.part].first + run.into, run.count, bounce.data());
        } else {
          std::size_t got = 0;
          for (std::size_t q = run.part; got < run.count; ++q) {
            (*sink)(parts[q].first, parts[q].second, bounce.data() + got * es);
            got += parts[q].second;
          }
        }
      }
      from += run.count;
    }
  }
}

/// The checksums of entries held in parts (computed by rank 0 while assembling) into `crcs`,
/// on rank 0; crc_share leaves them out. Local.
inline void parts_crcs(const std::vector<CkptEntry>& entries, std::size_t n,
                       std::vector<std::int64_t>& crcs, int rank) {
  if (rank != 0) return;
  for (std::size_t i = 0; i < n; ++i)
    if (entries[i].sharded) crcs[i] = static_cast<std::int64_t>(entries[i].crc);
}

}  // namespace dtrain::detail
