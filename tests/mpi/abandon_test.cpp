// Timeouts that say who, and abandonment without crashes, over MPI (mpiexec -n 2 and -n 3):
// - np 3: a peer stopped with SIGSTOP is named as stopped by the ranks that wait for it;
// - np 2: a rank stopped while it waits (SIGSTOP from its peer, longer than the deadline, then
//   SIGCONT) moves its deadline back instead of blaming the healthy peer: the collective
//   completes; if the peer really does not come, the error says this rank was descheduled;
// - np 3, no node-shared window (DTRAIN_SHM=0's path): a stopped rank resumed after the others
//   gave up, freed their buffers and reused the heap runs its late collective into a timeout,
//   and nobody crashes;
// - np 2 and 3: a rank stopped when the transports close (their node-shared window's
//   MPI_Win_free waits for every rank): the others' close ends within its limit, keeping the
//   window, and the late rank's close, resumed after that, does not wait for them either.
// The ranks signal each other by pid (all run on this node under mpiexec -n N).
#include <doctest/doctest.h>
#include <mpi.h>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi.hpp>

#include "stopped_peer_util.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_abandon_test {

using namespace dtrain;
using namespace dtrain::test;

namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

CommConfig cfg(double timeout_s) {
  CommConfig c;
  c.timeout_s = timeout_s;
  c.segment_bytes = 4096;
  return c;
}

// Ranks 0 and 1 both done with their checks before rank 0 resumes the stopped rank 2.
void resume_rank2_after_both(int rank, int pid2) {
  int token = 0;
  if (rank == 1) MPI_Send(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
  if (rank == 0) {
    MPI_Recv(&token, 1, MPI_INT, 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    kill(pid2, SIGCONT);
  }
}

}  // namespace

TEST_CASE("a stopped peer on this node is named as stopped") {
  if (world_size() != 3) return;
  const std::vector<int> pids = world_pids();
  {
    MpiTransport t(MPI_COMM_WORLD);
    Communicator comm(t, cfg(2));
    std::vector<float> x(1000, 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    if (t.rank() == 2) {
      raise(SIGSTOP);  // until rank 0 sends SIGCONT after its timeout
      // The others are gone: it times out, and says that it was the late one.
      const std::string msg = ring_allreduce_error(comm, x);
      CAPTURE(msg);
      CHECK(contains(msg, "timed out after 2 s"));
      CHECK(contains(msg, "this rank itself did not run for "));
      CHECK(contains(msg, "probably arrived after its peers had given up waiting for it"));
    } else {
      const std::string msg = ring_allreduce_error(comm, x);
      CAPTURE(msg);
      CHECK(contains(msg, "timed out after 2 s"));
      CHECK(contains(msg, "rank 2 (pid " + std::to_string(pids[2]) + " on this node) is stopped"));
      CHECK_FALSE(contains(msg, "this rank itself did not run"));
      resume_rank2_after_both(t.rank(), pids[2]);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a rank stopped while it waits does not blame its healthy peer") {
  if (world_size() != 2) return;
  const std::vector<int> pids = world_pids();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  SUBCASE("the peer comes after the stop: the collective completes") {
    MpiTransport t(MPI_COMM_WORLD);
    Communicator comm(t, cfg(1.5));
    std::vector<float> x(1000, 1.0f + static_cast<float>(rank));
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
      sleep_s(0.3);  // rank 0 is waiting by now
      kill(pids[0], SIGSTOP);
      sleep_s(2.5);  // longer than the 1.5 s deadline
      kill(pids[0], SIGCONT);
    }
    const double t0 = now_seconds();
    CHECK_NOTHROW(
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring));
    if (rank == 0) CHECK(now_seconds() - t0 > 1.5);  // it really was stopped past its deadline
    CHECK(x[0] == 3.0f);
    CHECK(x[999] == 3.0f);
  }
  SUBCASE("the peer never comes: the error says this rank was descheduled") {
    MpiTransport t(MPI_COMM_WORLD);
    Communicator comm(t, cfg(1.5));
    std::vector<float> x(1000, 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
      sleep_s(0.3);
      kill(pids[0], SIGSTOP);
      sleep_s(2.5);
      kill(pids[0], SIGCONT);
      sleep_s(2.0);  // past rank 0's deadline (1.5 s moved back by the 2.5 s stop); no call
    } else {
      const std::string msg = ring_allreduce_error(comm, x);
      CAPTURE(msg);
      CHECK(contains(msg, "wait for rank 1 timed out after 1.5 s"));
      CHECK(contains(msg, "this rank itself did not run for "));
      CHECK(contains(msg, "rank 1 is not known to be at fault"));
      CHECK_FALSE(contains(msg, "is stopped"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("a late peer waking up after the others gave up crashes nobody") {
  if (world_size() != 3) return;
  const std::vector<int> pids = world_pids();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  SharedSegmentConfig no_shm;
  no_shm.enabled = false;  // point-to-point only, as with DTRAIN_SHM=0
  std::vector<std::vector<float>> kept;
  {
    MpiTransport t(MPI_COMM_WORLD, no_shm);
    Communicator comm(t, cfg(1));
    // 4 MiB: MPI moves it by rendezvous, so a late receiver reads from the sender's memory.
    std::vector<float> x(1 << 20, 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 2) raise(SIGSTOP);  // until rank 0 sends SIGCONT after its timeout
    const std::string msg = ring_allreduce_error(comm, x);
    CAPTURE(msg);
    if (rank != 2) CHECK(contains(msg, "rank 2"));
    CHECK_FALSE(msg.empty());
    // The documented contract: when transfers could not be cancelled, the buffers stay.
    if (contains(msg, "could not be cancelled")) {
      MESSAGE("kept the buffers: " << msg);
      kept.push_back(std::move(x));
    }
  }
  if (rank != 2) {
    // Reuse the heap that held the collective's (freed) memory, then let the late rank run.
    std::vector<std::vector<float>> reuse;
    for (int k = 0; k < 6; ++k) reuse.emplace_back(1 << 20, 7.0f);
    resume_rank2_after_both(rank, pids[2]);
    sleep_s(0.5);
    for (const auto& v : reuse) CHECK(v[v.size() / 2] == 7.0f);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // progresses MPI on every rank while late messages arrive
}

TEST_CASE("a rank stopped at the transport's close: nobody waits for it past the limit") {
  if (world_size() < 2 || world_size() > 3) return;
  const std::vector<int> pids = world_pids();
  const int rank = world_rank(), late = world_size() - 1;
  SharedSegmentConfig seg;
  seg.close_timeout_s = 1;
  auto t = std::make_unique<MpiTransport>(MPI_COMM_WORLD, seg);
  REQUIRE(t->node_segments() != nullptr);  // the window whose release is collective
  {
    Communicator comm(*t, cfg(10));
    std::vector<float> x(1000, 1.0f);
    CHECK(ring_allreduce_error(comm, x).empty());
    CHECK(x[0] == static_cast<float>(world_size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == late) raise(SIGSTOP);  // until rank 0 sends SIGCONT after the others closed
  const double t0 = now_seconds();
  t.reset();
  const double took = now_seconds() - t0;
  CAPTURE(took);
  CHECK(took < seg.close_timeout_s + 4);
  if (rank != late) resume_last_rank_after_others(pids, 79);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace dtrain_test_abandon_test
