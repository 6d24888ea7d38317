// Multi-level checkpoints on real MPI through Communicator<MpiTransport>: every rank a fake node
// (DTRAIN_RANKS_PER_NODE=1, read by the transport), partner copies sent as MPI messages, restore
// from the partner after a node's directory is lost and from the shared level after a node and
// its partner are lost, bit-exact. With DTRAIN_TEST_PRIVATE_LOCAL_DIR set (by
// tests/mpi/ckpt_levels_private_dir.sh) every rank runs in a mount namespace of its own with an
// empty tmpfs over that one path: the same local_dir on every rank is then a different directory
// per node, as on a cluster. Levels set only by the batch script's DTRAIN_CKPT_* variables reach
// a Checkpointer built with default options.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi.hpp>

#include "ckpt/fake_state.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_ckpt_mpi_levels {

namespace fs = std::filesystem;
using dtrain::CheckpointLevel;
using dtrain::named;
using dtrain::per_rank;
using dtrain::test::FakeRun;
using MpiComm = dtrain::Communicator<dtrain::MpiTransport>;

namespace {

// A directory name chosen by rank 0 and shared with every rank.
std::string common_dir(const std::string& tag) {
  static int counter = 0;
  char buf[512] = {};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const std::string d =
        (fs::temp_directory_path() / ("dtrain_ckpt_mpi_levels_" + tag + "_" +
                                      std::to_string(::getpid()) + "_" + std::to_string(counter)))
            .string();
    fs::remove_all(d);
    std::strncpy(buf, d.c_str(), sizeof buf - 1);
  }
  ++counter;
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

// Every rank a node of its own for the transports constructed while it lives.
struct OneRankPerNode {
  OneRankPerNode() { ::setenv("DTRAIN_RANKS_PER_NODE", "1", 1); }
  ~OneRankPerNode() { ::unsetenv("DTRAIN_RANKS_PER_NODE"); }
};

template <class C>
void save_run(C& ckpt, std::int64_t step, FakeRun& r) {
  ckpt.save(step, named("model", r.model), named("optimizer", r.opt),
            per_rank("sampler", r.sampler), named("dropout", r.dropout),
            named("schedule", r.sched));
}

// Restores into a fresh run and checks it bit for bit against the run replayed to `want`.
template <class C>
void check_restore(C& ckpt, MpiComm& comm, std::int64_t want, CheckpointLevel where, int node) {
  FakeRun r(comm.rank() + 50);
  const auto step = ckpt.restore_latest(named("model", r.model), named("optimizer", r.opt),
                                        per_rank("sampler", r.sampler), named("dropout", r.dropout),
                                        named("schedule", r.sched));
  REQUIRE(step.has_value());
  CHECK(*step == want);
  CHECK(ckpt.restored_level() == where);
  CHECK(ckpt.restored_node() == node);
  FakeRun expected(comm.rank());
  for (std::int64_t s = 1; s <= want; ++s) expected.step(comm);
  CHECK(dtrain::test::first_difference(expected, r) == "");
}

void remove_checkpoints(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
}

// The scenario on `local(rank)` as each rank's node-local directory.
void run_levels(MpiComm& comm, const std::string& shared,
                const std::function<std::string()>& local) {
  const int p = comm.size();
  auto opts = [&] {
    dtrain::CheckpointOptions o;
    o.keep_last = 2;
    o.levels.local_dir = local();
    o.levels.local_every = 1;
    o.levels.shared_every = 2;
    o.levels.transfer_timeout_seconds = 60;
    return o;
  };
  {
    dtrain::Checkpointer<MpiComm> ckpt(comm, shared, opts());
    REQUIRE(ckpt.nodes() == p);
    CHECK(ckpt.node() == comm.rank());
    FakeRun r(comm.rank());
    for (int s = 1; s <= 4; ++s) {
      r.step(comm);
      save_run(ckpt, s, r);
    }
    ckpt.wait();
    const auto mine = ckpt.local_files();
    // Node 0 and its partner, node 1, hold steps 3 and 4; other nodes nothing.
    if (comm.rank() <= 1 && p > 1) {
      REQUIRE(mine.size() == 2);
      CHECK(mine[0].step == 4);
    } else if (p > 1) {
      CHECK(mine.empty());
    }
    if (comm.rank() == 0) CHECK(ckpt.files().front().step == 4);
  }
  if (p == 1) return;
  // Node 0's directory is lost: restored from node 1, and node 0's copy is rebuilt.
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) remove_checkpoints(local());
  MPI_Barrier(MPI_COMM_WORLD);
  {
    dtrain::Checkpointer<MpiComm> ckpt(comm, shared, opts());
    check_restore(ckpt, comm, 4, CheckpointLevel::partner, 1);
    if (comm.rank() == 0) CHECK(ckpt.local_files().size() == 1);
  }
  // Node 0's and node 1's are lost: the shared level.
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() <= 1) remove_checkpoints(local());
  MPI_Barrier(MPI_COMM_WORLD);
  {
    dtrain::Checkpointer<MpiComm> ckpt(comm, shared, opts());
    check_restore(ckpt, comm, 4, CheckpointLevel::shared, -1);
  }
}

}  // namespace

TEST_CASE("levels over MPI: partner copies as messages, restore from the partner and shared") {
  OneRankPerNode fake_nodes;
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  const std::string base = common_dir("msg");
  run_levels(comm, base + "/shared", [&] { return base + "/node" + std::to_string(comm.rank()); });
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(base);
}

TEST_CASE("levels from the environment only: a wiped node restored from the partner copy") {
  OneRankPerNode fake_nodes;
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  // 2 ranks as 2 nodes; 3 ranks take no other path through the environment (CI time).
  if (comm.size() != 2) return;
  const std::string base = common_dir("env");
  const std::string shared = base + "/shared";
  const std::string local = base + "/node" + std::to_string(comm.rank());
  // What a batch script exports; the program passes no level options.
  ::setenv("DTRAIN_CKPT_LOCAL_DIR", local.c_str(), 1);
  ::setenv("DTRAIN_CKPT_LOCAL_EVERY", "1", 1);
  {
    dtrain::Checkpointer<MpiComm> ckpt(comm, shared);
    CHECK(ckpt.options().levels.local_dir == local);
    FakeRun r(comm.rank());
    for (int s = 1; s <= 2; ++s) {
      r.step(comm);
      CHECK(ckpt.maybe_save(s, named("model", r.model), named("optimizer", r.opt),
                            per_rank("sampler", r.sampler), named("dropout", r.dropout),
                            named("schedule", r.sched)));
    }
    ckpt.wait();
    // Node 0 and its partner hold the node-local copies.
    if (comm.rank() <= 1) CHECK(ckpt.local_files().front().step == 2);
  }
  // Node 0's local directory is wiped: the restart restores from node 1's partner copy.
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) remove_checkpoints(local);
  MPI_Barrier(MPI_COMM_WORLD);
  {
    dtrain::Checkpointer<MpiComm> ckpt(comm, shared);
    check_restore(ckpt, comm, 2, CheckpointLevel::partner, 1);
  }
  // read_env off: the options as given, no levels.
  {
    dtrain::CheckpointOptions o;
    o.read_env = false;
    dtrain::Checkpointer<MpiComm> ckpt(comm, shared, o);
    CHECK_FALSE(ckpt.options().levels.enabled());
  }
  // The variables on some ranks only: refused on every rank, not a hang.
  if (comm.rank() != 0) ::unsetenv("DTRAIN_CKPT_LOCAL_DIR");
  CHECK_THROWS_WITH_AS(dtrain::Checkpointer<MpiComm>(comm, shared),
                       doctest::Contains("differ between ranks"), dtrain::InvalidArgument);
  ::unsetenv("DTRAIN_CKPT_LOCAL_DIR");
  ::unsetenv("DTRAIN_CKPT_LOCAL_EVERY");
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(base);
}

// Skipped (reported as such) except where tests/mpi/ckpt_levels_private_dir.sh runs it with
// --no-skip, every rank in a mount namespace of its own.
TEST_CASE("levels over MPI with one local_dir path, a private directory on every node" *
          doctest::skip()) {
  const char* local = std::getenv("DTRAIN_TEST_PRIVATE_LOCAL_DIR");
  const char* shared = std::getenv("DTRAIN_TEST_SHARED_DIR");
  REQUIRE_MESSAGE((local && shared),
                  "DTRAIN_TEST_PRIVATE_LOCAL_DIR or DTRAIN_TEST_SHARED_DIR "
                  "unset: run through tests/mpi/ckpt_levels_private_dir.sh");
  OneRankPerNode fake_nodes;
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  REQUIRE(comm.size() >= 2);
  // The setup: a file one rank writes there is not seen by the others.
  const std::string probe = std::string(local) + "/probe-" + std::to_string(comm.rank());
  {
    FILE* f = std::fopen(probe.c_str(), "w");
    REQUIRE(f);
    std::fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int r = 0; r < comm.size(); ++r)
    CHECK(fs::exists(std::string(local) + "/probe-" + std::to_string(r)) == (r == comm.rank()));
  fs::remove(probe);
  MPI_Barrier(MPI_COMM_WORLD);
  run_levels(comm, shared, [&] { return std::string(local); });
}

}  // namespace dtrain_test_ckpt_mpi_levels
