// SPDX-License-Identifier: BSD-3-Clause
// dtrain: one checkpoint save as the write strategies receive it: the manifest's metadata, the
// entries to store and where the file goes.
#pragma once

#include <string>
#include <vector>

#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>

namespace dtrain::detail {

/// Where a checkpoint is written and how it is published (rank 0: rename, fsync, prune).
struct CkptTarget {
  std::string dir, prefix, extension, tmp_path, final_path;
  int keep_last = 1;
  void publish() const {
    publish_checkpoint(tmp_path, final_path, dir, prefix, extension.c_str(), keep_last);
  }
};

/// The state of one save on one rank. Entries point at the caller's objects until snapshotted.
struct CkptSaveJob {
  CkptManifest m;               // metadata filled in; entries empty
  std::vector<CkptEntry> repl;  // replicated state (identical on every rank), checksums to do
  std::vector<CkptEntry> mine;  // this rank's per-rank state, checksums done
  CkptTarget target;
};

}  // namespace dtrain::detail
