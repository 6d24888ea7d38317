// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the restore path. The file has been verified (by rank 0, or by every rank for its
// share: restore_distributed.hpp); this distributes its content: metadata to every rank, a check
// pass on every rank (nothing is modified until all agree that the objects match the file), then
// the tensors. From rank 0: replicated tensors by broadcast and per-rank state sent to its owner;
// rank 0 takes each tensor's bytes from its entry, or, where the entry carries none (a file
// verified without keeping its data), reads them from the file just then, into the object's own
// memory where it can: it never holds the whole checkpoint. Distributed: every rank reads its
// runs of each replicated tensor into the object's memory and broadcasts them, and reads its own
// per-rank state.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <dtrain/ckpt/checkpoint_options.hpp>
#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/collectives.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/ckpt/detail/objects.hpp>
#include <dtrain/ckpt/detail/restore_distributed.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>

namespace dtrain::detail {

/// Test knob: called on rank 0 with the chosen file once it is verified and open for the reads
/// that follow (tests change the file there; it must not throw). Set it before the restore,
/// clear it after.
inline std::function<void(const std::string&)>& ckpt_restore_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

/// Rank 0's reader of a tensor entry's bytes when the entry carries none: fills `dst`
/// (entry.bytes(), host memory) or throws (IoError: the file changed since it was verified).
using CkptReadData = std::function<void(const CkptEntry&, void*)>;

/// Rank 0: entry `e`'s bytes into `dst`, from the entry or through `read`. A failed read is kept
/// in `failed` (the first; later reads are skipped) and `dst` zero-filled instead, so that the
/// restore's collectives go on to the agreement at its end, where every rank throws it.
inline void ckpt_entry_bytes(const CkptEntry& e, void* dst, const CkptReadData& read,
                             std::exception_ptr& failed) {
  const std::size_t n = e.bytes();
  if (n == 0) return;
  if (e.data) {
    std::memcpy(dst, e.data, n);
    return;
  }
  if (!failed) {
    try {
      if (!read)
        raise<InvalidArgument>("checkpoint restore",
                               e.path + ": the entry has no data and there is no file to read");
      read(e, dst);
      return;
    } catch (...) {
      failed = std::current_exception();
    }
  }
  std::memset(dst, 0, n);
}

/// A distributed restore's read of one of this rank's runs of a tensor entry into `dst` (host
/// memory, run.count elements), checked against the run's verified crc32c; throws IoError.
using CkptReadRun = std::function<void(const CkptEntry&, const CkptRun&, void*)>;

/// A read of the elements [first, first + count) of a tensor entry of the chosen file, in
/// row-major order, into `dst` (host memory); returns their crc32c; throws IoError.
using CkptReadSpan =
    std::function<std::uint32_t(const CkptEntry&, std::uint64_t first, std::uint64_t count, void*)>;

/// This rank's `parts` of tensor entry `e` into `held` (back to back), each checked against its
/// verified crc32c: a read of this rank's own node-local part file. Throws IoError.
using CkptReadParts = std::function<void(const CkptEntry&, BufferView held, const StateParts&)>;

/// Where a restore's tensor bytes come from: rank 0 (entries' data, or `read` on rank 0), or,
/// with `plan`, every rank's runs through `read_run` (every rank holds the metadata already).
/// Tensors an object holds in parts load only its parts: through `read_parts` where set (each
/// rank from its own part file, no collective), else by runs of elements read with `read_span`:
/// by rank 0 and broadcast (`plan` null), or by each rank for its own parts (distributed); these
/// two are collective per tensor.
struct CkptSource {
  CkptReadData read;
  const CkptReadPlan* plan = nullptr;
  CkptReadRun read_run;
  CkptReadSpan read_span;
  CkptReadParts read_parts;
  bool* checked = nullptr;  // where set: true once every rank agreed that the objects match
};

template <class Comm>
struct CkptFetch {
  Comm* comm;
  int rank;
  bool broadcast;  // rank 0 holds the bytes and broadcasts them
  const CkptReadData* read;
  std::exception_ptr* failed;
};

template <class Comm>
void ckpt_fetch_entry(void* ctx, const CkptEntry& e, BufferView dst) {
  auto* c = static_cast<CkptFetch<Comm>*>(ctx);
  if (c->rank == 0 || !c->broadcast) ckpt_entry_bytes(e, dst.data, *c->read, *c->failed);
  if (c->broadcast && dst.count) c->comm->broadcast(dst, 0);
}

template <class Comm>
struct CkptRunFetch {
  Comm* comm;
  int rank;
  bool broadcast;  // each run goes from its reader to every rank
  const CkptReadPlan* plan;
  const CkptReadRun* read;
  std::exception_ptr* failed;
};

// Entry `e`'s runs into `dst`: this rank reads its own (a failed read is kept in `failed`, the
// first, and the run zero-filled, as ckpt_entry_bytes does), and each is broadcast from its reader.
template <class Comm>
void ckpt_fetch_runs(void* ctx, const CkptEntry& e, BufferView dst) {
  auto* c = static_cast<CkptRunFetch<Comm>*>(ctx);
  const auto it = c->plan->runs.find(e.path);
  if (it == c->plan->runs.end()) return;  // no elements
  for (const CkptRun& run : it->second) {
    BufferView part =
        dst.slice(static_cast<std::size_t>(run.first), static_cast<std::size_t>(run.count));
    if (run.reader == c->rank) {
      bool done = false;
      if (!*c->failed) {
        try {
          (*c->read)(e, run, part.data);
          done = true;
        } catch (...) {
          *c->failed = std::current_exception();
        }
      }
      if (!done) std::memset(part.data, 0, part.bytes());
    }
    if (c->broadcast) c->comm->broadcast(part, run.reader);
  }
}

/// Elements of a tensor held in parts moved per broadcast at most, when rank 0 reads them for
/// the ranks (the receivers' bounce buffer).
inline constexpr std::size_t kRestorePieceBytes = std::size_t{4} << 20;

template <class Comm>
struct CkptPartsFetch {
  Comm* comm;
  int rank;
  const CkptSource* src;
  std::exception_ptr* failed;
  std::vector<unsigned char>* bounce;
};

// The elements [first, first + count) of `e` into `dst`: from the entry's bytes where it carries
// them, else through the source's read_span; the crc32c of what was read.
inline std::uint32_t ckpt_span_bytes(const CkptSource& src, const CkptEntry& e, std::uint64_t first,
                                     std::uint64_t count, void* dst) {
  const std::size_t es = size_of(e.dtype), n = static_cast<std::size_t>(count) * es;
  if (e.data) {
    std::memcpy(dst, static_cast<const unsigned char*>(e.data) + first * es, n);
    return crc32c(dst, n);
  }
  if (!src.read_span)
    raise<InvalidArgument>("checkpoint restore",
                           e.path + ": the entry has no data and there is no file to read");
  return src.read_span(e, first, count, dst);
}

// This rank's `parts` of entry `e` into `held`. With the source's read_parts: local. Otherwise
// collective over the ranks (every rank loads the same tensors in parts: the check pass's trace
// says so): the ranks' lists of parts reach every rank; with rank 0 reading (no plan), rank 0
// reads each rank's parts in runs of at most kRestorePieceBytes and broadcasts them, the others
// keeping their own; distributed, every rank reads its own. The runs' checksums, combined in
// element order, must give the tensor's verified one where the parts cover it exactly once. A
// failed read is kept in `failed` (the first) and zeros stand in, as for whole tensors.
template <class Comm>
void ckpt_fetch_parts(void* ctx, const CkptEntry& e, BufferView held, const StateParts& parts) {
  auto* c = static_cast<CkptPartsFetch<Comm>*>(ctx);
  const CkptSource& src = *c->src;
  std::exception_ptr& failed = *c->failed;
  auto* out = static_cast<unsigned char*>(held.data);
  const std::size_t es = size_of(e.dtype);
  if (src.read_parts) {
    if (!failed) {
      try {
        src.read_parts(e, held, parts);
        return;
      } catch (...) {
        failed = std::current_exception();
      }
    }
    if (held.count) std::memset(out, 0, held.count * es);
    return;
  }
  Comm& comm = *c->comm;
  const int rank = c->rank, p = comm.size();
  const std::uint64_t n = element_count(e.shape);
  // Every rank's parts, [count, first, n, ...] per rank.
  std::vector<unsigned char> own;
  {
    std::vector<std::int64_t> list{static_cast<std::int64_t>(parts.size())};
    for (const auto& [first, count] : parts) {
      list.push_back(static_cast<std::int64_t>(first));
      list.push_back(static_cast<std::int64_t>(count));
    }
    own.resize(list.size() * sizeof(std::int64_t));
    std::memcpy(own.data(), list.data(), own.size());
  }
  const auto lists = ckpt_gather_blobs(comm, own, true);
  std::vector<StateParts> of(static_cast<std::size_t>(p));
  bool inside = true;
  for (int s = 0; s < p; ++s) {
    std::vector<std::int64_t> l(lists[static_cast<std::size_t>(s)].size() / 8);
    if (!l.empty()) std::memcpy(l.data(), lists[static_cast<std::size_t>(s)].data(), l.size() * 8);
    const std::size_t k = l.empty() ? 0 : static_cast<std::size_t>(l[0]);
    for (std::size_t j = 0; j < k && 2 + 2 * j < l.size(); ++j) {
      const auto first = static_cast<std::uint64_t>(l[1 + 2 * j]);
      const auto count = static_cast<std::uint64_t>(l[2 + 2 * j]);
      inside = inside && first <= n && count <= n - first;
      of[static_cast<std::size_t>(s)].emplace_back(static_cast<std::size_t>(first),
                                                   static_cast<std::size_t>(count));
    }
  }
  if (!inside) {  // the same verdict on every rank: nobody reads, nobody waits
    if (!failed)
      failed = std::make_exception_ptr(make_error<InvalidArgument>(
          "checkpoint restore",
          e.path + ": a rank holds parts outside the tensor's " + std::to_string(n) + " elements"));
    if (held.count) std::memset(out, 0, held.count * es);
    return;
  }
  const std::size_t piece = std::max<std::size_t>(1, kRestorePieceBytes / es);
  struct Read {
    std::uint64_t first, count;
    std::uint32_t crc;
  };
  std::vector<Read> reads;  // rank 0 (all runs) or, distributed, this rank's
  auto read_into = [&](std::uint64_t first, std::uint64_t count, void* dst) {
    std::uint32_t crc = 0;
    bool done = false;
    if (!failed) {
      try {
        crc = ckpt_span_bytes(src, e, first, count, dst);
        done = true;
      } catch (...) {
        failed = std::current_exception();
      }
    }
    if (!done) std::memset(dst, 0, static_cast<std::size_t>(count) * es);
    reads.push_back({first, count, crc});
  };
  const bool distributed = src.plan != nullptr;
  if (distributed || p == 1) {
    std::size_t at = 0;
    for (const auto& [first, count] : parts) {
      if (count) read_into(first, count, out + at * es);
      at += count;
    }
  } else {
    std::vector<unsigned char>& bounce = *c->bounce;
    for (int s = 0; s < p; ++s) {
      std::size_t at = 0;  // elements of rank s's held data before the part
      for (const auto& [first, count] : of[static_cast<std::size_t>(s)]) {
        for (std::size_t into = 0; into < count; into += piece) {
          const std::size_t k = std::min(piece, count - into);
          void* buf;
          if (rank == s) {
            buf = out + (at + into) * es;
          } else {
            if (bounce.size() < k * es) bounce.resize(k * es);
            buf = bounce.data();
          }
          if (rank == 0) read_into(first + into, k, buf);
          if (s != 0) comm.broadcast(BufferView(buf, k, e.dtype), 0);
        }
        at += count;
      }
    }
  }
  // The verified checksum again, where the ranks' parts tile the tensor: from rank 0's reads,
  // or, distributed, from every rank's (one allreduce over the ranks' runs, in rank order).
  if (distributed && p > 1) {
    std::vector<std::int64_t> crcs;
    std::size_t mine = 0;
    for (int s = 0; s < p; ++s)
      for (const auto& part : of[static_cast<std::size_t>(s)]) {
        if (s == rank && part.second)
          crcs.push_back(reads[mine++].crc);
        else
          crcs.push_back(0);
      }
    if (!crcs.empty())
      comm.allreduce(BufferView(crcs.data(), crcs.size(), DType::i64), ReduceOp::sum);
    reads.clear();
    std::size_t k = 0;
    for (int s = 0; s < p; ++s)
      for (const auto& [first, count] : of[static_cast<std::size_t>(s)])
        reads.push_back({first, count, static_cast<std::uint32_t>(crcs[k++])});
  }
  if (rank != 0 || failed) return;
  std::sort(reads.begin(), reads.end(),
            [](const Read& a, const Read& b) { return a.first < b.first; });
  std::uint64_t end = 0;
  std::uint32_t crc = 0;
  for (const Read& r : reads) {
    if (r.count == 0) continue;
    if (r.first != end) return;  // not a tiling: the verification stands alone
    crc = crc32c_combine(crc, r.crc, static_cast<std::size_t>(r.count) * es);
    end += r.count;
  }
  if (end != n || crc == e.crc) return;
  char buf[128];
  std::snprintf(buf, sizeof buf,
                ": checksum mismatch (stored crc32c %08x, data gives %08x) since the file was "
                "verified",
                e.crc, crc);
  failed = std::make_exception_ptr(make_error<IoError>("checkpoint read", e.path + buf));
}

/// Collective. From rank 0 (`src.plan` null): `m` holds the file's content on rank 0 (anything
/// elsewhere): metadata, and each tensor's bytes or, where an entry has none, `src.read` (rank 0)
/// fetches them from the file. Distributed (`src.plan`): `m` holds the metadata on every rank and
/// each rank reads the plan's runs it is the reader of through `src.read_run`. Fills the objects
/// on every rank. Throws (on every rank) InvalidArgument when the objects do not
/// match, before modifying any; and, after filling them, the error of a read that failed (the
/// objects then hold zeros where that tensor and the ones after it would be: restore again).
template <class Comm, class... Ts>
void restore_objects(Comm& comm, const CheckpointOptions& opt, CkptManifest& m,
                     const std::string& file, const CkptSource& src, const Named<Ts>&... objects) {
  const char* op = "checkpoint restore";
  const int rank = comm.rank(), p = comm.size();
  const CkptReadData& read = src.read;
  // Everyone gets the file's metadata (names, shapes, scalars) from rank 0.
  if (!src.plan) ckpt_bcast_metadata(comm, m);
  LoadVisitor::Index index;
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
          if (!opt.reset_per_rank_on_resize)
            first = "per-rank object '" + n.name + "': the checkpoint was written by " +
                    std::to_string(m.world_size) + " ranks and this run has " + std::to_string(p) +
                    " (set CheckpointOptions::reset_per_rank_on_resize to keep its current "
                    "state)";
          return;
        }
        prefix = "/ranks/" + std::to_string(rank) + "/" + n.name;
      }
      LoadVisitor v(index, prefix, LoadVisitor::Mode::check);
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
    if (!first.empty()) raise<InvalidArgument>(op, file + " does not match the objects: " + first);
  } catch (...) {
    err = std::current_exception();
  }
  ckpt_agree(comm, err, op);
  DTRAIN_REQUIRE(ckpt_same_everywhere(comm, crc32c(trace.data(), trace.size()),
                                      static_cast<std::uint32_t>(trace.size())),
                 op,
                 "replicated objects differ in structure between ranks; pass rank-specific "
                 "state with dtrain::per_rank");
  if (src.checked) *src.checked = true;

  // Replicated state: rank 0 fills its objects from the file and broadcasts tensor by tensor;
  // distributed, every rank reads its runs of each tensor and broadcasts them.
  std::exception_ptr failed;  // this rank's first failed read
  CkptFetch<Comm> bc{&comm, rank, p > 1, &read, &failed};
  CkptRunFetch<Comm> runs{&comm, rank, p > 1, src.plan, &src.read_run, &failed};
  const LoadVisitor::Fetch fetch = src.plan ? &ckpt_fetch_runs<Comm> : &ckpt_fetch_entry<Comm>;
  void* const fetch_ctx = src.plan ? static_cast<void*>(&runs) : static_cast<void*>(&bc);
  std::vector<unsigned char> bounce;
  CkptPartsFetch<Comm> in_parts{&comm, rank, &src, &failed, &bounce};
  auto apply_replicated = [&](const auto& n) {
    if (n.placement != Placement::replicated) return;
    LoadVisitor v(index, "/" + n.name, LoadVisitor::Mode::apply, fetch, fetch_ctx);
    v.set_parts_fetch(&ckpt_fetch_parts<Comm>, &in_parts);
    visit_object(v, *n.object);
  };
  (apply_replicated(objects), ...);

  // Per-rank state: distributed, each rank reads its own; otherwise rank 0 sends each rank its
  // own entries.
  if (!resized && src.plan) {
    CkptRunFetch<Comm> own{&comm, rank, false, src.plan, &src.read_run, &failed};
    auto apply_own = [&](const auto& n) {
      if (n.placement != Placement::per_rank) return;
      LoadVisitor v(index, "/ranks/" + std::to_string(rank) + "/" + n.name,
                    LoadVisitor::Mode::apply, &ckpt_fetch_runs<Comm>, &own);
      visit_object(v, *n.object);
    };
    (apply_own(objects), ...);
  } else if (!resized) {
    for (int s = 0; s < p; ++s) {
      std::vector<CkptEntry> own;
      if (s == 0) {
        if (rank != 0) continue;
      } else {
        BlobWriter w;
        if (rank == 0) {
          std::int64_t count = 0;
          for (const auto& e : m.entries) count += e.owner == s;
          w.put_i64(count);
          for (const auto& e : m.entries) {
            if (e.owner != s) continue;
            if (e.kind != EntryKind::tensor || e.data || e.bytes() == 0) {
              encode_entry(w, e, true);
              continue;
            }
            CkptEntry with = e;  // read from the file for this rank only
            with.storage.resize(e.bytes());
            ckpt_entry_bytes(e, with.storage.data(), read, failed);
            with.data = with.storage.data();
            encode_entry(w, with, true);
          }
        }
        ckpt_bcast_bytes(comm, w.bytes(), 0);
        if (rank != s) continue;
        BlobReader r(w.bytes().data(), w.bytes().size());
        const auto n = r.get_i64();
        for (std::int64_t i = 0; i < n; ++i) own.push_back(decode_entry(r));
      }
      LoadVisitor::Index own_index;
      if (s == 0)
        own_index = index;
      else
        for (const auto& e : own) own_index[e.path] = &e;
      CkptFetch<Comm> local{&comm, rank, false, &read, &failed};
      auto apply_own = [&](const auto& n) {
        if (n.placement != Placement::per_rank) return;
        LoadVisitor v(own_index, "/ranks/" + std::to_string(rank) + "/" + n.name,
                      LoadVisitor::Mode::apply, &ckpt_fetch_entry<Comm>, &local);
        visit_object(v, *n.object);
      };
      (apply_own(objects), ...);
    }
  } else if (rank == 0 && opt.reset_per_rank_on_resize) {
    DTRAIN_LOG(warn, "checkpoint " << file << " was written by " << m.world_size
                                   << " ranks; per-rank objects keep their current state");
  }
  ckpt_agree(comm, failed, op);
}

/// Collective. As above, every tensor's bytes in its entry on rank 0.
template <class Comm, class... Ts>
void restore_objects(Comm& comm, const CheckpointOptions& opt, CkptManifest& m,
                     const std::string& file, const Named<Ts>&... objects) {
  restore_objects(comm, opt, m, file, CkptSource{}, objects...);
}

}  // namespace dtrain::detail
