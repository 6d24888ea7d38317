// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the identity of a training run (CheckpointOptions::run_id), kept in the run directory
// and recorded in every checkpoint file, and the rule that decides whether a node-local or
// partner copy belongs to the run being restored.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>

namespace dtrain::detail {

/// The file of the run directory that holds the run's identity.
inline constexpr const char* kRunIdFile = "dtrain-run-id";

/// 1 to 128 characters of [A-Za-z0-9._:-].
inline bool valid_run_id(const std::string& id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

/// A fresh identity: 128 bits from the system's entropy source, as 32 hex digits.
inline std::string make_run_id() {
  std::random_device rd;
  std::string id;
  char buf[16];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

/// The identity stored in `path`, "" when the file does not exist; IoError when it cannot be read
/// or holds no valid identity.
inline std::string read_run_id(const std::string& path, const char* op) {
  std::ifstream f(path);
  if (!f) {
    if (errno == ENOENT) return {};
    raise<IoError>(op, "open " + path + ": " + errno_text(errno));
  }
  std::string id((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
  if (!valid_run_id(id))
    raise<IoError>(op, path +
                           " does not hold a run identity (1 to 128 characters of "
                           "[A-Za-z0-9._:-]); remove it to give the run a new identity, or set "
                           "DTRAIN_CKPT_RUN_ID");
  return id;
}

/// Writes `id` durably to `path` (temporary, fsync, then rename when `replace`, else link, which
/// keeps an identity another process created first). Returns the identity the file holds after.
inline std::string write_run_id(const std::string& dir, const std::string& id, bool replace,
                                const char* op) {
  const std::string path = dir + "/" + kRunIdFile;
  const std::string tmp = dir + "/." + kRunIdFile + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << id << '\n';
    f.close();
    if (!f) raise<IoError>(op, "write " + tmp + ": " + errno_text(errno));
  }
  std::string held = id;
  try {
    fsync_path(tmp, false, op);
    if (replace) {
      rename_path(tmp, path, op);
    } else {
      if (::link(tmp.c_str(), path.c_str()) != 0) {
        if (errno != EEXIST) raise<IoError>(op, "link " + path + ": " + errno_text(errno));
        held = read_run_id(path, op);  // another Checkpointer of the run was first
      }
      remove_file_quietly(tmp);
    }
    fsync_path(dir, true, op);
  } catch (...) {
    remove_file_quietly(tmp);
    throw;
  }
  return held;
}

/// Rank 0 of the Checkpointer's constructor, after the run directory exists: the run's identity.
/// `adopt` set: that identity, written to the run directory's file. Else the file's, or a fresh
/// one written there when the directory has none yet. A run directory that cannot take the file
/// (read-only: a job that only restores) gets a warning, and the identity holds for this job.
inline std::string resolve_run_id(const std::string& dir, const std::string& adopt,
                                  const char* op) {
  const std::string path = dir + "/" + kRunIdFile;
  const std::string held = read_run_id(path, op);
  auto write = [&](const std::string& id, bool replace) {
    try {
      return write_run_id(dir, id, replace, op);
    } catch (const IoError& e) {
      DTRAIN_LOG(warn, "checkpoints: the run identity "
                           << id << " could not be recorded in " << path << " (" << e.what()
                           << "): later jobs will not restore the node-local copies of this one");
      return id;
    }
  };
  if (!adopt.empty()) {
    DTRAIN_REQUIRE(valid_run_id(adopt), op,
                   "run identity '" << adopt
                                    << "' (CheckpointOptions::run_id or DTRAIN_CKPT_RUN_ID) is "
                                       "not 1 to 128 characters of [A-Za-z0-9._:-]");
    if (held == adopt) return adopt;
    DTRAIN_LOG(info, "checkpoints: adopting run identity "
                         << adopt << (held.empty() ? std::string() : " (was " + held + ")")
                         << " in " << path);
    return write(adopt, true);
  }
  if (!held.empty()) return held;
  return write(make_run_id(), false);
}

/// Why a node-local or partner copy (`run_id`, `shared_step` from its file) must not be restored
/// in run `run_id_now`, whose run directory holds checkpoints `shared` (steps, any order) and has
/// received the steps up to `flushed` (read_flush_record; -1: none); "" when it may be. A copy of
/// another run is refused, and so is a copy that follows a checkpoint the run directory received
/// and no longer holds while it holds no older one: a rollback deleted it. A checkpoint never
/// received (its flush did not complete) or older than every one there (pruned by keep_last)
/// refuses nothing.
inline std::string copy_refusal(const std::string& run_id, std::int64_t shared_step,
                                const std::string& run_id_now,
                                const std::vector<std::int64_t>& shared, std::int64_t flushed) {
  if (run_id != run_id_now)
    return run_id.empty() ? "it was written before run identities, this run is " + run_id_now
                          : "it belongs to run " + run_id + ", this run is " + run_id_now;
  if (shared_step < 0 || shared_step > flushed ||
      std::find(shared.begin(), shared.end(), shared_step) != shared.end() ||
      (!shared.empty() && shared_step < *std::min_element(shared.begin(), shared.end())))
    return {};
  return "it follows step " + std::to_string(shared_step) +
         " of the run directory, which is no longer there (rolled back)";
}

}  // namespace dtrain::detail
