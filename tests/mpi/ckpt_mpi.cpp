// Checkpointer on real MPI (1-3 ranks in CTest): bit-exact resume with every write strategy and
// either restore strategy, identical file contents across strategies, fallback from a damaged
// file, and restore on fewer ranks, and (through tests/mpi/ckpt_private_dir.sh) a run directory
// only rank 0 sees. Distributed restores read in runs of 12 bytes or more here, so that every
// tensor is read by several ranks.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/mpi_comm.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_ckpt_mpi {

namespace fs = std::filesystem;
using dtrain::CheckpointOptions;
using dtrain::CheckpointStrategy;
using dtrain::named;
using dtrain::per_rank;
using dtrain::test::FakeRun;
using dtrain::test::MpiTestComm;
using Ckpt = dtrain::Checkpointer<MpiTestComm>;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// A directory name chosen by rank 0 and shared with every rank.
std::string shared_dir(const std::string& tag) {
  static int counter = 0;
  char buf[512] = {};
  if (world_rank() == 0) {
    const std::string d =
        (fs::temp_directory_path() / ("dtrain_ckpt_mpi_" + tag + "_" + std::to_string(::getpid()) +
                                      "_" + std::to_string(counter)))
            .string();
    fs::remove_all(d);
    std::strncpy(buf, d.c_str(), sizeof buf - 1);
  }
  ++counter;
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

void cleanup(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
}

template <class... Ts>
auto all_objects(FakeRun& r) {
  return std::make_tuple(named("model", r.model), named("optimizer", r.opt),
                         per_rank("sampler", r.sampler), named("dropout", r.dropout),
                         named("schedule", r.sched));
}

void save_run(Ckpt& c, std::int64_t step, FakeRun& r) {
  std::apply([&](auto&&... o) { c.save(step, o...); }, all_objects(r));
}
bool maybe_save_run(Ckpt& c, std::int64_t step, FakeRun& r) {
  return std::apply([&](auto&&... o) { return c.maybe_save(step, o...); }, all_objects(r));
}
std::optional<std::int64_t> restore_run(Ckpt& c, FakeRun& r) {
  return std::apply([&](auto&&... o) { return c.restore_latest(o...); }, all_objects(r));
}

// Runs of 12 bytes for a test's distributed restores (every rank sets it).
struct SmallRuns {
  std::size_t saved = dtrain::detail::ckpt_run_bytes();
  SmallRuns() { dtrain::detail::ckpt_run_bytes() = 12; }
  ~SmallRuns() { dtrain::detail::ckpt_run_bytes() = saved; }
};

CheckpointOptions opts(CheckpointStrategy s, bool async, std::int64_t every = 0) {
  CheckpointOptions o;
  o.strategy = s;
  o.async = async;
  o.every_steps = every;
  o.keep_last = 2;
  o.config = "mpi test";
  return o;
}

}  // namespace

TEST_CASE("bit-exact resume on MPI with every write strategy, either restore strategy") {
  MpiTestComm comm(MPI_COMM_WORLD);
  SmallRuns small;
  using dtrain::RestoreStrategy;
  struct Case {
    CheckpointStrategy s;
    bool async;
    RestoreStrategy restore;  // automatic: distributed after an MPI-IO strategy, else rank0
  };
  for (Case c : {Case{CheckpointStrategy::rank0, false, RestoreStrategy::automatic},
                 Case{CheckpointStrategy::rank0, true, RestoreStrategy::distributed},
                 Case{CheckpointStrategy::parallel_rank0, false, RestoreStrategy::automatic},
                 Case{CheckpointStrategy::parallel_slices, false, RestoreStrategy::automatic},
                 Case{CheckpointStrategy::parallel_slices, false, RestoreStrategy::rank0}}) {
    CAPTURE(dtrain::name_of(c.s));
    CAPTURE(c.async);
    CAPTURE(dtrain::name_of(c.restore));
    const std::string dir = shared_dir("resume");
    FakeRun ref(comm.rank());
    for (int s = 1; s <= 4; ++s) ref.step(comm);
    {
      Ckpt ckpt(comm, dir, opts(c.s, c.async, 2));
      FakeRun run(comm.rank());
      for (std::int64_t s = 1; s <= 3; ++s) {
        run.step(comm);
        maybe_save_run(ckpt, s, run);
      }
      ckpt.wait();
      CHECK(ckpt.strategy() == c.s);
    }
    CheckpointOptions ro = opts(c.s, c.async);
    ro.restore = c.restore;
    Ckpt ckpt(comm, dir, ro);
    const RestoreStrategy expected = c.restore != RestoreStrategy::automatic ? c.restore
                                     : c.s == CheckpointStrategy::rank0
                                         ? RestoreStrategy::rank0
                                         : RestoreStrategy::distributed;
    CHECK(ckpt.restore_strategy() == expected);
    FakeRun resumed(comm.rank());
    REQUIRE(restore_run(ckpt, resumed) == std::optional<std::int64_t>(2));
    for (int s = 3; s <= 4; ++s) resumed.step(comm);
    CHECK(dtrain::test::first_difference(ref, resumed) == "");
    cleanup(dir);
  }
}

TEST_CASE("every strategy writes the same entries, bit for bit") {
  MpiTestComm comm(MPI_COMM_WORLD);
  const std::string dir = shared_dir("same");
  FakeRun run(comm.rank());
  run.step(comm);
  std::vector<std::string> files;
  for (auto s : {CheckpointStrategy::rank0, CheckpointStrategy::parallel_rank0,
                 CheckpointStrategy::parallel_slices}) {
    CheckpointOptions o = opts(s, false);
    o.prefix = dtrain::name_of(s);
    Ckpt ckpt(comm, dir, o);
    save_run(ckpt, 1, run);
    files.push_back(ckpt.path_for(1));
  }
  if (comm.rank() == 0) {
    const auto a = dtrain::Hdf5Format::read(files[0]);
    for (std::size_t k = 1; k < files.size(); ++k) {
      CAPTURE(files[k]);
      const auto b = dtrain::Hdf5Format::read(files[k]);
      CHECK(b.world_size == comm.size());
      REQUIRE(a.entries.size() == b.entries.size());
      for (std::size_t i = 0; i < a.entries.size(); ++i) {
        const auto &x = a.entries[i], &y = b.entries[i];
        CAPTURE(x.path);
        CHECK(x.path == y.path);
        CHECK(x.shape == y.shape);
        CHECK(x.crc == y.crc);
        CHECK(x.i64 == y.i64);
        CHECK(x.str == y.str);
        CHECK(x.storage == y.storage);
      }
    }
  }
  cleanup(dir);
}

TEST_CASE("a rank stalled inside a parallel write: the others' deadline names the write") {
  // Rank 1 stops for 1.5 s inside the watched write, before the collective file creation; the
  // other ranks wait in MPI-IO for it. With a 0.5 s deadline every rank's watchdog fires (the
  // expiry hook records the message instead of ending the job), and once rank 1 comes back the
  // write completes as usual.
  MpiTestComm comm(MPI_COMM_WORLD);
  if (comm.size() < 2) {
    MESSAGE("skipped: needs 2 or more ranks");
    return;
  }
  const std::string dir = shared_dir("stall");
  FakeRun run(comm.rank());
  run.step(comm);
  std::vector<std::string> fired;
  dtrain::detail::io_watchdog_expiry_hook() = [&](const std::string& msg) { fired.push_back(msg); };
  dtrain::detail::ckpt_parallel_write_hook() = [](int rank) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  };
  CheckpointOptions o = opts(CheckpointStrategy::parallel_rank0, false);
  o.parallel_write_timeout_seconds = 0.5;
  {
    Ckpt ckpt(comm, dir, o);
    save_run(ckpt, 1, run);
  }
  dtrain::detail::ckpt_parallel_write_hook() = nullptr;
  dtrain::detail::io_watchdog_expiry_hook() = nullptr;
  REQUIRE(fired.size() == 1);
  CAPTURE(fired[0]);
  CHECK(fired[0].find("dtrain: rank " + std::to_string(comm.rank()) + ": checkpoint") == 0);
  CHECK(fired[0].find(dir) != std::string::npos);
  CHECK(fired[0].find("did not finish within 0.5 s") != std::string::npos);
  CHECK(fired[0].find(std::to_string(comm.size()) + " ranks") != std::string::npos);
  // The write went on and its checkpoint restores.
  Ckpt again(comm, dir, opts(CheckpointStrategy::parallel_rank0, false));
  FakeRun back(comm.rank());
  CHECK(restore_run(again, back) == std::optional<std::int64_t>(1));
  cleanup(dir);
}

TEST_CASE("a corrupt newest checkpoint falls back to the previous one on MPI") {
  MpiTestComm comm(MPI_COMM_WORLD);
  SmallRuns small;
  for (auto restore : {dtrain::RestoreStrategy::rank0, dtrain::RestoreStrategy::distributed}) {
    CAPTURE(dtrain::name_of(restore));
    const std::string dir = shared_dir("corrupt");
    FakeRun at1(comm.rank());
    {
      Ckpt ckpt(comm, dir, opts(CheckpointStrategy::parallel_slices, false));
      FakeRun run(comm.rank());
      run.step(comm);
      at1.step(comm);
      save_run(ckpt, 1, run);
      run.step(comm);
      save_run(ckpt, 2, run);
    }
    if (comm.rank() == 0) {
      const std::string newest = dir + "/ckpt-000000000002.h5";
      hid_t f = H5Fopen(newest.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      hid_t d = H5Dopen2(f, "/model/fc2/weight", H5P_DEFAULT);
      const auto off = H5Dget_offset(d);
      H5Dclose(d);
      H5Fclose(f);
      std::fstream io(newest, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(static_cast<std::streamoff>(off + 3));
      io.put('\x7f');
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CheckpointOptions ro = opts(CheckpointStrategy::rank0, false);
    ro.restore = restore;
    Ckpt ckpt(comm, dir, ro);
    FakeRun b(comm.rank());
    CHECK(restore_run(ckpt, b) == std::optional<std::int64_t>(1));
    CHECK(dtrain::test::first_difference(at1, b) == "");
    // The damaged file is kept under another name (by rank 0, once restored); restoring it by
    // name throws on every rank.
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(fs::exists(dir + "/ckpt-000000000002.h5.damaged"));
    FakeRun c(comm.rank());
    CHECK_THROWS_WITH_AS(
        std::apply([&](auto&&... o) { ckpt.restore(dir + "/ckpt-000000000002.h5.damaged", o...); },
                   all_objects(c)),
        doctest::Contains("checksum mismatch"), dtrain::Error);
    cleanup(dir);
  }
}

TEST_CASE("restore on fewer ranks: replicated state restored, per-rank state refused") {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  if (p < 2) return;
  const std::string dir = shared_dir("fewer");
  std::vector<float> w_saved;
  {
    MpiTestComm comm(MPI_COMM_WORLD);
    Ckpt ckpt(comm, dir, opts(CheckpointStrategy::parallel_rank0, false));
    FakeRun run(comm.rank());
    for (int i = 0; i < 3; ++i) run.step(comm);
    save_run(ckpt, 3, run);
    auto w = run.model.fc2.weight.as<float>();
    w_saved.assign(w.begin(), w.end());
  }
  SmallRuns small;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < p - 1 ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  if (sub != MPI_COMM_NULL) {
    for (auto restore : {dtrain::RestoreStrategy::rank0, dtrain::RestoreStrategy::distributed}) {
      CAPTURE(dtrain::name_of(restore));
      MpiTestComm comm(sub);
      CheckpointOptions ro = opts(CheckpointStrategy::rank0, false);
      ro.restore = restore;  // distributed: the per-rank state of the missing rank is read too
      Ckpt ckpt(comm, dir, ro);
      FakeRun run(comm.rank());
      CHECK_THROWS_WITH_AS(restore_run(ckpt, run), doctest::Contains("written by"),
                           dtrain::InvalidArgument);
      auto step = ckpt.restore_latest(named("model", run.model), named("optimizer", run.opt),
                                      named("dropout", run.dropout), named("schedule", run.sched));
      CHECK(step == std::optional<std::int64_t>(3));
      auto w = run.model.fc2.weight.as<float>();
      CHECK(std::vector<float>(w.begin(), w.end()) == w_saved);
      CHECK(run.opt.steps == 3);
    }
    MPI_Comm_free(&sub);
  }
  cleanup(dir);
}

// Skipped (reported as such) except where tests/mpi/ckpt_private_dir.sh runs it with --no-skip:
// 2 ranks, rank 1 with an empty tmpfs over the directory, as rank 0's node-local /tmp would be on
// a cluster.
TEST_CASE("a run directory only rank 0 sees: a distributed restore says so, rank0 restores" *
          doctest::skip()) {
  const char* env = std::getenv("DTRAIN_TEST_PRIVATE_DIR");
  REQUIRE_MESSAGE(env, "DTRAIN_TEST_PRIVATE_DIR unset: run through tests/mpi/ckpt_private_dir.sh");
  MpiTestComm comm(MPI_COMM_WORLD);
  REQUIRE(comm.size() == 2);
  const std::string dir = env;
  FakeRun at1(comm.rank());
  {
    Ckpt ckpt(comm, dir, opts(CheckpointStrategy::rank0, false));
    FakeRun run(comm.rank());
    run.step(comm);
    at1.step(comm);
    save_run(ckpt, 1, run);
  }
  const std::string file = dir + "/ckpt-000000000001.h5";
  CHECK(fs::exists(file) == (comm.rank() == 0));  // the setup: rank 1 does not see it
  CheckpointOptions ro = opts(CheckpointStrategy::rank0, false);
  ro.restore = dtrain::RestoreStrategy::distributed;
  Ckpt distributed(comm, dir, ro);
  FakeRun b(comm.rank());
  CHECK_THROWS_WITH_AS(restore_run(distributed, b),
                       doctest::Contains("on a filesystem every rank sees"), dtrain::Error);
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) {  // not taken for damage: nothing renamed
    CHECK(fs::exists(file));
    CHECK_FALSE(fs::exists(file + ".damaged"));
  }
  Ckpt rank0(comm, dir, opts(CheckpointStrategy::rank0, false));
  CHECK(rank0.restore_strategy() == dtrain::RestoreStrategy::rank0);
  FakeRun c(comm.rank());
  CHECK(restore_run(rank0, c) == std::optional<std::int64_t>(1));
  CHECK(dtrain::test::first_difference(at1, c) == "");
}

}  // namespace dtrain_test_ckpt_mpi
