// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the POSIX file operations that make a checkpoint durable and its publication atomic.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain::detail {

/// fsync of a file or directory by path. A directory fsync makes a rename in it durable.
inline void fsync_path(const std::string& path, bool directory, const char* operation) {
  int fd;
  do {
    fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) raise<IoError>(operation, "open " + path + " for fsync: " + errno_text(errno));
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); the rename is still atomic there.
  if (rc != 0 && !(directory && (err == EINVAL || err == EROFS)))
    raise<IoError>(operation, "fsync " + path + ": " + errno_text(err));
}

/// rename(2): atomic replacement within one file system.
inline void rename_path(const std::string& from, const std::string& to, const char* operation) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    raise<IoError>(operation, "rename " + from + " -> " + to + ": " + errno_text(errno));
}

inline void make_directories(const std::string& dir, const char* operation) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) raise<IoError>(operation, "cannot create directory " + dir + ": " + ec.message());
  if (!std::filesystem::is_directory(dir, ec))
    raise<IoError>(operation, dir + " exists and is not a directory");
}

/// A checkpoint file found in a run directory.
struct FoundCheckpoint {
  std::int64_t step;
  std::string path;
};

/// Files named <prefix>-<digits><extension> in `dir`, newest step first.
inline std::vector<FoundCheckpoint> list_checkpoint_files(const std::string& dir,
                                                          const std::string& prefix,
                                                          const std::string& extension) {
  std::vector<FoundCheckpoint> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) return out;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const std::string head = prefix + "-";
    if (name.size() <= head.size() + extension.size()) continue;
    if (name.compare(0, head.size(), head) != 0) continue;
    if (name.compare(name.size() - extension.size(), extension.size(), extension) != 0) continue;
    const std::string digits =
        name.substr(head.size(), name.size() - head.size() - extension.size());
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.push_back({std::stoll(digits), it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const FoundCheckpoint& a, const FoundCheckpoint& b) { return a.step > b.step; });
  return out;
}

/// Temporary files left by an interrupted save: ".<prefix>-*.tmp*".
inline std::vector<std::string> list_stale_temporaries(const std::string& dir,
                                                       const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) return out;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const std::string head = "." + prefix + "-";
    if (name.compare(0, head.size(), head) == 0 && name.find(".tmp") != std::string::npos)
      out.push_back(it->path().string());
  }
  return out;
}

inline void remove_file_quietly(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

/// Rank 0 of a save: makes the finished temporary durable under its final name, then deletes
/// all but the newest `keep_last` checkpoints of the run directory. Local, blocking.
inline void publish_checkpoint(const std::string& tmp_path, const std::string& final_path,
                               const std::string& dir, const std::string& prefix,
                               const char* extension, int keep_last) {
  const char* op = "checkpoint save";
  rename_path(tmp_path, final_path, op);
  fsync_path(dir, true, op);
  const auto found = list_checkpoint_files(dir, prefix, extension);
  for (std::size_t i = static_cast<std::size_t>(keep_last); i < found.size(); ++i)
    remove_file_quietly(found[i].path);
}

}  // namespace dtrain::detail
