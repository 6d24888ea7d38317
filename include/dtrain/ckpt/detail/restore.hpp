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

/// Where a restore's tensor bytes come from: rank 0 (entries' data, or `read` on rank 0), or,
/// with `plan`, every rank's runs through `read_run` (every rank holds the metadata already).
struct CkptSource {
  CkptReadData read;
  const CkptReadPlan* plan = nullptr;
  CkptReadRun read_run;
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

  // Replicated state: rank 0 fills its objects from the file and broadcasts tensor by tensor;
  // distributed, every rank reads its runs of each tensor and broadcasts them.
  std::exception_ptr failed;  // this rank's first failed read
  CkptFetch<Comm> bc{&comm, rank, p > 1, &read, &failed};
  CkptRunFetch<Comm> runs{&comm, rank, p > 1, src.plan, &src.read_run, &failed};
  const LoadVisitor::Fetch fetch = src.plan ? &ckpt_fetch_runs<Comm> : &ckpt_fetch_entry<Comm>;
  void* const fetch_ctx = src.plan ? static_cast<void*>(&runs) : static_cast<void*>(&bc);
  auto apply_replicated = [&](const auto& n) {
    if (n.placement != Placement::replicated) return;
    LoadVisitor v(index, "/" + n.name, LoadVisitor::Mode::apply, fetch, fetch_ctx);
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
