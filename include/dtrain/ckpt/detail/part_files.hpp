// SPDX-License-Identifier: BSD-3-Clause
// dtrain: node-local part files, the node-local level of a checkpoint whose state is held in parts
// over the ranks (fully sharded or sharded state). Every rank writes its own part file into its
// node's directory: its parts of the tensors held in parts (a dataset of the elements it holds,
// under the tensor's own path), its per-rank state, and on rank 0 the replicated state that is
// not held in parts; `/held_parts/<path>` records which elements each dataset holds. The files
// are ordinary checkpoint files (the same header, run identity and checksums); the shared level
// still receives the one-file checkpoint.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/ckpt/detail/save_job.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

/// The group of a part file that says which elements its datasets hold (a reserved object name).
inline constexpr const char* kHeldPartsGroup = "/held_parts";

/// `<prefix>-<step, 12 digits>.rank<r>-of-<p><extension>`: rank r's part of checkpoint `step` of
/// a run on p ranks. The one-file checkpoints' listing never matches it.
inline std::string part_file_name(const std::string& prefix, std::int64_t step, int rank, int p,
                                  const std::string& extension) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(step));
  return prefix + "-" + digits + ".rank" + std::to_string(rank) + "-of-" + std::to_string(p) +
         extension;
}

/// A part file found in a node-local directory.
struct FoundPart {
  std::int64_t step = 0;
  int origin = 0;  // the rank whose part it is
  int of = 0;      // the world size of the run that wrote it
  std::string path;
};

/// Part files in `dir`, newest step first (then by origin). Local.
inline std::vector<FoundPart> list_part_files(const std::string& dir, const std::string& prefix,
                                              const std::string& extension) {
  std::vector<FoundPart> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) return out;
  auto digits_at = [](const std::string& s, std::size_t from, std::size_t to, long long& v) {
    if (to <= from || to - from > 18) return false;
    for (std::size_t i = from; i < to; ++i)
      if (s[i] < '0' || s[i] > '9') return false;
    v = std::stoll(s.substr(from, to - from));
    return true;
  };
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const std::string head = prefix + "-";
    if (name.size() <= head.size() + 12 + extension.size() || name.compare(0, head.size(), head))
      continue;
    if (name.compare(name.size() - extension.size(), extension.size(), extension)) continue;
    const std::size_t body_end = name.size() - extension.size();
    const std::size_t r_at = head.size() + 12;
    long long step = 0, origin = 0, of = 0;
    if (!digits_at(name, head.size(), r_at, step)) continue;
    if (name.compare(r_at, 5, ".rank")) continue;
    const std::size_t dash = name.find("-of-", r_at + 5);
    if (dash == std::string::npos || dash > body_end) continue;
    if (!digits_at(name, r_at + 5, dash, origin) || !digits_at(name, dash + 4, body_end, of))
      continue;
    if (of < 1 || origin >= of || of > (1 << 30)) continue;
    out.push_back({step, static_cast<int>(origin), static_cast<int>(of), it->path().string()});
  }
  std::sort(out.begin(), out.end(), [](const FoundPart& a, const FoundPart& b) {
    return a.step != b.step ? a.step > b.step : a.origin < b.origin;
  });
  return out;
}

/// Deletes all but the newest `keep_last` part files of rank `origin` of a run on `of` ranks in
/// `dir`. Local.
inline void prune_part_files(const std::string& dir, const std::string& prefix,
                             const std::string& extension, int origin, int of, int keep_last) {
  int kept = 0;
  for (const FoundPart& f : list_part_files(dir, prefix, extension))
    if (f.origin == origin && f.of == of && ++kept > keep_last) remove_file_quietly(f.path);
}

/// Where rank `origin`'s part of checkpoint `step` goes in `dir` (publish: rename, fsync of the
/// directory; the one-file checkpoints of `dir` keep their keep-last).
inline CkptTarget part_target(const std::string& dir, const std::string& prefix,
                              const std::string& extension, std::int64_t step, int origin, int p,
                              int keep_last) {
  CkptTarget t;
  t.dir = dir;
  t.prefix = prefix;
  t.extension = extension;
  t.keep_last = keep_last;
  const std::string name = part_file_name(prefix, step, origin, p, extension);
  t.tmp_path = dir + "/." + name + ".tmp";
  t.final_path = dir + "/" + name;
  return t;
}

/// Local. This rank's part file of a save (entries point at the job's data, which must outlive
/// the write): rank 0's replicated entries not held in parts (checksums taken here), this rank's
/// parts of each tensor held in parts as a dataset of its held elements with its layout under
/// kHeldPartsGroup ([ndim, whole dims..., parts, (first, count, crc32c) per part], i64), its
/// per-rank entries, and the scalar `/held_parts/rank`. The header is the job's.
inline CkptManifest part_manifest(const CkptSaveJob& job, int rank) {
  CkptManifest m;
  m.format_version = job.m.format_version;
  m.step = job.m.step;
  m.world_size = job.m.world_size;
  m.library_version = job.m.library_version;
  m.config = job.m.config;
  m.strategy = "parts";
  m.created_unix = job.m.created_unix;
  m.run_id = job.m.run_id;
  m.shared_step = job.m.shared_step;
  std::vector<CkptEntry> layouts;
  for (const CkptEntry& e : job.repl) {
    if (!e.sharded) {
      if (rank != 0) continue;
      CkptEntry c = e;
      if (c.kind == EntryKind::tensor) c.crc = crc32c(c.data, c.bytes());
      m.entries.push_back(std::move(c));
      continue;
    }
    CkptEntry held;
    held.path = e.path;
    held.kind = EntryKind::tensor;
    held.dtype = e.dtype;
    held.shape = e.shape;  // {held elements}
    held.data = e.data;
    held.crc = crc32c(e.data, e.bytes());
    std::vector<std::int64_t> lay{static_cast<std::int64_t>(e.whole.size())};
    for (const auto d : e.whole) lay.push_back(d);
    lay.push_back(static_cast<std::int64_t>(e.parts.size()));
    const auto* src = static_cast<const unsigned char*>(e.data);
    const std::size_t es = size_of(e.dtype);
    for (const auto& [first, count] : e.parts) {
      lay.push_back(static_cast<std::int64_t>(first));
      lay.push_back(static_cast<std::int64_t>(count));
      lay.push_back(static_cast<std::int64_t>(crc32c(src, count * es)));
      src += count * es;
    }
    CkptEntry l;
    l.path = std::string(kHeldPartsGroup) + e.path;
    l.kind = EntryKind::tensor;
    l.dtype = DType::i64;
    l.shape = Shape{static_cast<std::int64_t>(lay.size())};
    l.storage.resize(lay.size() * sizeof(std::int64_t));
    std::memcpy(l.storage.data(), lay.data(), l.storage.size());
    l.data = l.storage.data();
    l.crc = crc32c(l.data, l.bytes());
    m.entries.push_back(std::move(held));
    layouts.push_back(std::move(l));
  }
  for (const CkptEntry& e : job.mine) m.entries.push_back(e);
  for (auto& l : layouts) m.entries.push_back(std::move(l));
  CkptEntry r;
  r.path = std::string(kHeldPartsGroup) + "/rank";
  r.kind = EntryKind::i64;
  r.i64 = rank;
  m.entries.push_back(std::move(r));
  return m;
}

/// One part of a tensor held in parts as its part file records it.
struct SavedPart {
  std::uint64_t first = 0, count = 0;
  std::uint32_t crc = 0;
  std::uint64_t at = 0;  // elements of the held dataset before it
};

/// A verified part file read back for a restore: the restore's metadata (tensors held in parts
/// with their whole shape, marked `sharded` with this rank's parts), each such tensor's saved
/// parts, and the file's own entries by path. Local.
struct PartFileView {
  std::vector<CkptEntry> held;                          // tensors held in parts, restore form
  std::map<std::string, std::vector<SavedPart>> parts;  // by path
  std::map<std::string, const CkptEntry*> file;         // the file's entries by path
};

/// Local. Reads the layouts of verified part file `m` (of rank `rank`, `path` for messages)
/// through `read_layout` (entry, destination: a checked read of a small i64 tensor). IoError
/// naming the file when a layout does not fit its dataset or the file is another rank's.
template <class ReadLayout>
PartFileView read_part_layouts(const CkptManifest& m, int rank, const std::string& path,
                               ReadLayout&& read_layout) {
  const char* op = "checkpoint restore";
  PartFileView v;
  for (const CkptEntry& e : m.entries) v.file[e.path] = &e;
  const std::string head = std::string(kHeldPartsGroup) + "/";
  const auto who = v.file.find(head + "rank");
  if (who == v.file.end() || who->second->kind != EntryKind::i64 || who->second->i64 != rank)
    raise<IoError>(op, path + " is not rank " + std::to_string(rank) + "'s part file");
  for (const CkptEntry& l : m.entries) {
    if (l.kind != EntryKind::tensor || l.path.compare(0, head.size(), head)) continue;
    const std::string target = l.path.substr(head.size() - 1);
    const auto t = v.file.find(target);
    std::vector<std::int64_t> lay(element_count(l.shape));
    if (l.dtype != DType::i64 || t == v.file.end() || t->second->kind != EntryKind::tensor ||
        t->second->shape.size() != 1)
      raise<IoError>(op, path + ":" + l.path + ": a layout without its dataset");
    read_layout(l, lay.data());
    const CkptEntry& d = *t->second;
    std::size_t at = 0;
    auto next = [&]() -> std::int64_t {
      if (at >= lay.size()) raise<IoError>(op, path + ":" + l.path + ": the layout is truncated");
      return lay[at++];
    };
    CkptEntry r;
    r.path = target;
    r.kind = EntryKind::tensor;
    r.dtype = d.dtype;
    r.crc = d.crc;
    r.sharded = true;
    const std::int64_t ndim = next();
    if (ndim < 0 || ndim > 32) raise<IoError>(op, path + ":" + l.path + ": bad layout");
    for (std::int64_t i = 0; i < ndim; ++i) r.shape.push_back(next());
    r.whole = r.shape;
    const std::uint64_t n = element_count(r.shape);
    const std::int64_t k = next();
    std::vector<SavedPart>& saved = v.parts[target];
    std::uint64_t held = 0, end = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      SavedPart s;
      s.first = static_cast<std::uint64_t>(next());
      s.count = static_cast<std::uint64_t>(next());
      s.crc = static_cast<std::uint32_t>(next());
      s.at = held;
      if (s.first < end || s.first > n || s.count > n - s.first)
        raise<IoError>(op, path + ":" + l.path + ": parts out of order or outside the tensor");
      end = s.first + s.count;
      held += s.count;
      r.parts.emplace_back(static_cast<std::size_t>(s.first), static_cast<std::size_t>(s.count));
      saved.push_back(s);
    }
    if (at != lay.size() || held != static_cast<std::uint64_t>(d.shape[0]))
      raise<IoError>(op, path + ":" + l.path + ": the layout does not match the dataset's " +
                             std::to_string(d.shape[0]) + " elements");
    v.held.push_back(std::move(r));
  }
  return v;
}

}  // namespace dtrain::detail
