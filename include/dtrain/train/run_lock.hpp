// SPDX-License-Identifier: BSD-3-Clause
// dtrain: RunDirLock, one job per run directory.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dtrain/core/error.hpp>
#include <dtrain/train/agreed.hpp>

namespace dtrain {

/// An exclusive lock on a run directory, held while the object lives: a second job that tries
/// to lock the same directory gets an IoError naming the directory and the holder (host, pid, as
/// written into DIR/lock by the holder). The lock is flock(2) on DIR/lock, so the kernel releases
/// it when the holding process exits or is killed, however it ends; a stale lock file is never a
/// problem. Local (take it on one rank, e.g. rank 0, and agree on the outcome); blocking only for
/// the directory creation; not thread-safe. Creates the directory (and parents) when missing.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& dir) : path_(dir + "/lock") {
    const char* op = "RunDirLock";
    make_dirs(dir, op);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) raise<IoError>(op, "cannot open '" + path_ + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      std::string holder = read_holder();
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK)
        raise<IoError>(op, "run directory '" + dir + "' is in use by another job" +
                               (holder.empty() ? std::string() : " (" + holder + ")") +
                               "; wait for it to finish or choose another run directory");
      raise<IoError>(op, "cannot lock '" + path_ + "': " + std::strerror(err));
    }
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    const std::string me = "host " + std::string(host) + ", pid " + std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0) {
      const ssize_t w = ::pwrite(fd_, me.data(), me.size(), 0);
      (void)w;  // the holder text is informational only
    }
  }
  ~RunDirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the only descriptor releases the flock
  }
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  /// Path of the lock file.
  const std::string& path() const noexcept { return path_; }

 private:
  static void make_dirs(const std::string& dir, const char* op) {
    std::string part;
    for (std::size_t i = 0; i <= dir.size(); ++i) {
      if (i == dir.size() || (dir[i] == '/' && i > 0)) {
        part = dir.substr(0, i);
        if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
          raise<IoError>(op, "cannot create '" + part + "': " + std::strerror(errno));
      }
    }
  }
  std::string read_holder() const {
    char buf[512] = {0};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }

  std::string path_;
  int fd_ = -1;
};

/// Collective over `comm` (agreed()): rank 0 takes the RunDirLock of `dir` for the whole job and
/// every rank learns the outcome, so that a directory in use ends the job on every rank with the
/// holder's name (AgreedError). Returns the lock on rank 0 (keep it until the job ends) and null
/// on the other ranks; an empty `dir` takes no lock and returns null without communicating.
/// Blocking; call it from the thread that drives `comm`.
template <class Comm>
std::unique_ptr<RunDirLock> lock_run_directory(Comm& comm, const std::string& dir) {
  std::unique_ptr<RunDirLock> lock;
  if (dir.empty()) return lock;
  agreed(comm, [&] {
    if (comm.rank() == 0) lock = std::make_unique<RunDirLock>(dir);
  });
  return lock;
}

}  // namespace dtrain
