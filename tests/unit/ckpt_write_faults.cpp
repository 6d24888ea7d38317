// A checkpoint save on a file system that fills up while the file is written. On a full file
// system (a tmpfs, a quota, a disk) a write that needs a new block fails with ENOSPC, while a later
// write into blocks the file already has succeeds, so a failed write can sit between successful
// ones. This binary replaces pwrite(2), the call HDF5's sec2 driver writes with: for each k in
// turn, the k-th write of a checkpoint temporary (*.h5.tmp) that needs a new 4 KiB page fails.
// The save must then fail on every rank, naming the file and the cause, and leave the checkpoint
// before it as the newest, whole; a save that returns must have published a file whose every
// checksum holds and that restores bit for bit. (HDF5 1.10 keeps small datasets in its sieve
// buffer until their close writes them: a close whose write failed, unchecked, once published
// files with a tensor of zeros.)
#include <doctest/doctest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/test_comm.hpp"

namespace {

// The pages (4 KiB) of checkpoint temporaries that writes have given blocks since the last
// reset, by file descriptor: a write into them needs no new block and cannot fail for space.
std::mutex g_mu;
std::set<std::pair<int, off_t>> g_pages;
long g_writes = 0;    // writes since the last reset that needed a new block
long g_fail_at = -1;  // the one of those that fails; -1: none
constexpr off_t kPage = 4096;

bool is_checkpoint_temporary(int fd) {
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char path[4096];
  const ssize_t n = ::readlink(link, path, sizeof path);
  if (n <= 0) return false;
  const std::string_view p(path, static_cast<std::size_t>(n));
  const std::string_view tail = ".h5.tmp";
  return p.size() > tail.size() && p.substr(p.size() - tail.size()) == tail;
}

void reset_faults(long fail_at) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_pages.clear();
  g_writes = 0;
  g_fail_at = fail_at;
}

long allocating_writes() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_writes;
}

}  // namespace

// The program's own pwrite comes before libc's for every library of the process (HDF5 included).
extern "C" ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  if (count > 0 && is_checkpoint_temporary(fd)) {
    std::lock_guard<std::mutex> lock(g_mu);
    bool allocates = false;
    for (off_t pg = offset / kPage; pg <= (offset + static_cast<off_t>(count) - 1) / kPage; ++pg)
      allocates = allocates || g_pages.count({fd, pg}) == 0;
    if (allocates && g_writes++ == g_fail_at) {
      errno = ENOSPC;
      return -1;
    }
    for (off_t pg = offset / kPage; pg <= (offset + static_cast<off_t>(count) - 1) / kPage; ++pg)
      g_pages.insert({fd, pg});
  }
  return static_cast<ssize_t>(::syscall(SYS_pwrite64, fd, buf, count, offset));
}

namespace {

namespace fs = std::filesystem;
using dtrain::Checkpointer;
using dtrain::CheckpointOptions;
using dtrain::named;
using dtrain::per_rank;
using dtrain::test::FakeRun;
using dtrain::test::first_difference;
using dtrain::test::run_ranks;
using dtrain::test::ThreadComm;

// Layers 4 x 256 and 256 x 3: tensors of 1-4 KiB (as a small model's), a file of 17 pages, so
// that the failing write lands in each kind of write HDF5 makes (raw data of every size,
// object headers, attributes, the superblock).
constexpr std::int64_t kWidth = 256;

std::string fresh_dir() {
  static std::atomic<int> counter{0};
  const fs::path p =
      fs::temp_directory_path() /
      ("dtrain_ckpt_faults_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  return p.string();
}

template <class C>
void save_run(C& ckpt, std::int64_t step, FakeRun& r) {
  ckpt.save(step, named("model", r.model), named("optimizer", r.opt),
            per_rank("sampler", r.sampler), named("dropout", r.dropout),
            named("schedule", r.sched));
}
template <class C>
std::optional<std::int64_t> restore_run(C& ckpt, FakeRun& r) {
  return ckpt.restore_latest(named("model", r.model), named("optimizer", r.opt),
                             per_rank("sampler", r.sampler), named("dropout", r.dropout),
                             named("schedule", r.sched));
}

struct Outcome {
  long writes = 0;                   // writes of step 2's file (with the fault, up to the failure)
  int saved = 0, refused = 0;        // ranks whose save of step 2 (and wait) returned, or threw
  std::vector<std::int64_t> step;    // per rank: the step restored afterwards (-1: none)
  std::vector<std::string> differs;  // per rank: what differs from the state of that step
  std::string verify_error;          // Hdf5Format::verify of the newest file, by rank 0
  std::string error;                 // what rank 0's refused save said
};

// Saves step 1 unharmed, takes a step, saves step 2 with write `fail_at` of its file failing
// (-1: none), then restores into fresh state on the same ranks and compares with the state of
// the step that came back, recomputed.
Outcome save_with_fault(int ranks, bool async, long fail_at) {
  const std::string dir = fresh_dir();
  CheckpointOptions o;
  o.keep_last = 2;
  o.async = async;
  Outcome out;
  out.step.assign(static_cast<std::size_t>(ranks), -1);
  out.differs.assign(static_cast<std::size_t>(ranks), "");
  std::atomic<int> saved{0}, refused{0};
  run_ranks(ranks, [&](ThreadComm& comm) {
    const auto rank = static_cast<std::size_t>(comm.rank());
    {
      Checkpointer<ThreadComm> ckpt(comm, dir, o);
      FakeRun run(comm.rank(), kWidth);
      run.step(comm);
      save_run(ckpt, 1, run);
      ckpt.wait();
      run.step(comm);
      comm.barrier();
      if (rank == 0) reset_faults(fail_at);
      comm.barrier();
      try {
        save_run(ckpt, 2, run);
        ckpt.wait();
        ++saved;
      } catch (const dtrain::Error& e) {
        if (rank == 0) out.error = e.what();
        ++refused;
      }
      comm.barrier();
      if (rank == 0) {
        out.writes = allocating_writes();
        reset_faults(-1);
      }
      comm.barrier();
    }
    Checkpointer<ThreadComm> again(comm, dir, o);
    FakeRun back(comm.rank(), kWidth);
    const auto got = restore_run(again, back);
    out.step[rank] = got ? *got : -1;
    FakeRun expect(comm.rank(), kWidth);
    for (std::int64_t s = 0; s < (got ? *got : 0); ++s) expect.step(comm);
    out.differs[rank] = first_difference(expect, back);
    if (rank == 0 && got) {
      try {
        (void)dtrain::Hdf5Format::verify(again.path_for(*got));
      } catch (const std::exception& e) {
        out.verify_error = e.what();
      }
    }
  });
  out.saved = saved;
  out.refused = refused;
  fs::remove_all(dir);
  return out;
}

void every_write_failing(int ranks, bool async) {
  const Outcome clean = save_with_fault(ranks, async, -1);
  REQUIRE(clean.saved == ranks);
  // Writes counted: this binary's pwrite is the one HDF5 calls (else nothing here is tested).
  REQUIRE(clean.writes > 0);
  int refused = 0;
  for (long k = 0; k < clean.writes; ++k) {
    const Outcome r = save_with_fault(ranks, async, k);
    INFO("write " << k << " of " << clean.writes << " failed (" << ranks << " ranks, "
                  << std::string(async ? "asynchronous" : "synchronous") << " save)");
    INFO("rank 0's error: " << r.error);
    // Every rank learns the same outcome.
    CHECK((r.saved == ranks || r.refused == ranks));
    refused += r.refused == ranks ? 1 : 0;
    if (r.refused == ranks) {
      CHECK(r.error.find(".ckpt-000000000002.h5.tmp") != std::string::npos);
      CHECK(r.error.find("No space left on device") != std::string::npos);
    }
    for (int i = 0; i < ranks; ++i) {
      const auto u = static_cast<std::size_t>(i);
      // A save that returned is restored; a refused one leaves step 1 as the newest.
      CHECK(r.step[u] == (r.saved == ranks ? 2 : 1));
      CHECK_MESSAGE(r.differs[u].empty(), "rank " << i << " restored step " << r.step[u]
                                                  << " with a different " << r.differs[u]);
    }
    CHECK_MESSAGE(r.verify_error.empty(), r.verify_error);
  }
  // The faults reached the save (HDF5 cannot make every lost write good again).
  CHECK(refused > 0);
  MESSAGE(clean.writes << " writes, " << refused << " of them failing refused the save (" << ranks
                       << " ranks, " << std::string(async ? "asynchronous" : "synchronous") << ")");
}

}  // namespace

TEST_CASE("a save whose file loses any one write fails or publishes a whole file: 1 rank") {
  every_write_failing(1, false);
}

TEST_CASE("a save whose file loses any one write fails or publishes a whole file: 2 ranks") {
  every_write_failing(2, false);
}

TEST_CASE("an asynchronous save whose file loses any one write fails or is whole: 2 ranks") {
  every_write_failing(2, true);
}
