// The MPI-RMA transport under a stopped peer (mpiexec -n 2 and -n 3), with a 1 s deadline:
// - a collective with one rank stopped (SIGSTOP) ends on every live rank within the deadline
//   plus a margin, with an error naming the operation and the stopped rank, directly and
//   through AnyTransport (which forwards peer_status and abandoned). MPICH completes a flush to
//   a dynamic window only through the target's progress, so a write flushed on the waiting
//   thread would block here until the peer resumes: a rescuer thread resumes it after
//   kRescueSeconds, which the elapsed-time check then reports instead of a hang;
// - np 3: the stopped rank resumed after the others gave up, destroyed their transports (the
//   error caught inside the transport's scope, or unwinding through it) and reused the heap
//   runs its late collective (its puts land at the others) into a timeout, and nobody crashes
//   or finds its reused memory overwritten. MPI applies a late put to a dynamic window at the
//   target whether or not the range is still attached: when the transport freed its slots and
//   rings on a failing close, this case crashed with SIGSEGV (heap corruption).
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

#include <dtrain/comm/any_transport.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/expiry_timer.hpp>
#include <dtrain/transports/mpi_rma.hpp>

#include "stopped_peer_util.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_rma_deadline_test {

using namespace dtrain;
using namespace dtrain::test;

namespace {

constexpr double kDeadlineSeconds = 1;
constexpr double kMarginSeconds = 4;   // on top of the deadline, for a loaded machine
constexpr double kRescueSeconds = 15;  // a rank blocked in MPI gets its peer back after this

CommConfig cfg() {
  CommConfig c;
  c.timeout_s = kDeadlineSeconds;
  c.segment_bytes = 4096;
  return c;
}

// Resumes `pid` (if > 0) after kRescueSeconds unless cancelled first: a rank that blocks in MPI
// while its peer is stopped then finishes late (and fails its time check) instead of hanging the
// job.
class Rescuer {
 public:
  explicit Rescuer(int pid)
      : timer_(kRescueSeconds, [pid] {
          if (pid > 0) kill(pid, SIGCONT);
        }) {}

 private:
  dtrain::detail::ExpiryTimer timer_;
};

// The last rank is stopped before the collective; every other rank checks its error and time,
// then rank 0 resumes the stopped one once all live ranks are done.
template <class Comm>
void stopped_peer_case(Comm& comm, const std::vector<int>& pids) {
  const int p = world_size(), rank = world_rank(), stopped = p - 1;
  std::vector<float> x(1000, 1.0f);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == stopped) {
    raise(SIGSTOP);  // until rank 0 (or its rescuer) sends SIGCONT
    const std::string msg = ring_allreduce_error(comm, x);
    CAPTURE(msg);
    CHECK_FALSE(msg.empty());  // the others are gone: times out
  } else {
    std::string msg;
    double took = 0;
    {
      Rescuer rescue(rank == 0 ? pids[static_cast<std::size_t>(stopped)] : 0);
      const double t0 = now_seconds();
      msg = ring_allreduce_error(comm, x);
      took = now_seconds() - t0;
    }
    CAPTURE(msg);
    CAPTURE(took);
    CHECK(took < kDeadlineSeconds + kMarginSeconds);
    CHECK(contains(msg, "allreduce #"));
    CHECK(contains(msg, "timed out after 1 s"));
    CHECK(contains(msg, "rank " + std::to_string(stopped) + " (pid " +
                            std::to_string(pids[static_cast<std::size_t>(stopped)]) +
                            " on this node) is stopped"));
    // Every live rank is done before the stopped one resumes.
    int token = 0;
    if (rank != 0) MPI_Send(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
    if (rank == 0) {
      for (int q = 1; q < stopped; ++q)
        MPI_Recv(&token, 1, MPI_INT, q, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      kill(pids[static_cast<std::size_t>(stopped)], SIGCONT);
    }
  }
}

}  // namespace

TEST_CASE("mpi-rma: a stopped peer ends the collective within the deadline, named") {
  if (world_size() < 2 || world_size() > 3) return;
  const std::vector<int> pids = world_pids();
  SUBCASE("MpiRmaTransport") {
    {
      MpiRmaTransport t(MPI_COMM_WORLD);
      REQUIRE_MESSAGE(t.backend().asynchronous(), "the MPI test main asks MPI_THREAD_MULTIPLE");
      Communicator comm(t, cfg());
      stopped_peer_case(comm, pids);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  SUBCASE("through AnyTransport") {
    {
      MpiRmaTransport t(MPI_COMM_WORLD);
      AnyTransport any(t);
      Communicator<AnyTransport> comm(any, cfg());
      stopped_peer_case(comm, pids);
      CHECK(any.abandoned() == t.abandoned());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("mpi-rma: a late peer waking up after the others gave up crashes nobody") {
  if (world_size() != 3) return;
  const std::vector<int> pids = world_pids();
  const int rank = world_rank();
  // 4 MiB: zero-copy writes straight into the receivers' buffers, besides eager slots.
  std::vector<float> x(1 << 20, 1.0f);
  std::string msg;
  // The error either is caught while the transport lives (it then closes as failing because an
  // operation was abandoned) or unwinds through its destructor.
  bool unwind = false;
  SUBCASE("error caught inside the transport's scope") {}
  SUBCASE("error unwinding through the transport's destructor") { unwind = true; }
  try {
    MpiRmaTransport t(MPI_COMM_WORLD);
    Communicator comm(t, cfg());
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 2) raise(SIGSTOP);  // until rank 0 sends SIGCONT after the others gave up
    if (unwind)
      comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
    else
      msg = ring_allreduce_error(comm, x);
  } catch (const Error& e) {
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK_FALSE(msg.empty());
  if (rank != 2) CHECK(contains(msg, "rank 2"));
  // The documented contract: only when transfers could not be cancelled must the buffers stay.
  if (!contains(msg, "could not be cancelled")) std::vector<float>().swap(x);
  if (rank != 2) {
    // Reuse the heap that held the transport's and the collective's memory, then let the late
    // rank run: its puts and notifications land here while this rank progresses MPI.
    std::vector<std::vector<float>> reuse;
    for (int k = 0; k < 6; ++k) reuse.emplace_back(1 << 20, 7.0f);
    std::vector<std::vector<unsigned char>> small;
    for (int k = 0; k < 256; ++k) small.emplace_back(4096, static_cast<unsigned char>(k));
    int token = 0;
    if (rank == 1) MPI_Send(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
    if (rank == 0) {
      MPI_Recv(&token, 1, MPI_INT, 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      kill(pids[2], SIGCONT);
    }
    // Progresses MPI (rank 2's puts are applied here) until rank 2 ended its late collective.
    MPI_Barrier(MPI_COMM_WORLD);
    bool intact = true;
    for (const auto& v : reuse)
      for (float f : v) intact = intact && f == 7.0f;
    for (int k = 0; k < 256; ++k)
      for (unsigned char c : small[static_cast<std::size_t>(k)])
        intact = intact && c == static_cast<unsigned char>(k);
    CHECK(intact);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("mpi-rma: a rank reaching the close after the others gave up on it does not hang") {
  // The others' closing barrier times out (1 s) while the last rank is stopped; resumed, that
  // rank finds the barrier complete (every rank posted it) and must not then free the window,
  // which would wait forever for ranks that never call MPI_Win_free.
  if (world_size() < 2 || world_size() > 3) return;
  const std::vector<int> pids = world_pids();
  const int rank = world_rank(), late = world_size() - 1;
  constexpr double kCloseSeconds = 1;
  double took = 0;
  auto t = std::make_unique<MpiRmaTransport>(MPI_COMM_WORLD, kCloseSeconds);
  {
    Communicator comm(*t, cfg());
    std::vector<float> x(1000, 1.0f);
    CHECK(ring_allreduce_error(comm, x).empty());
    CHECK(x[0] == static_cast<float>(world_size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == late) raise(SIGSTOP);  // until rank 0 sends SIGCONT after the others closed
  {
    Rescuer rescue(rank == 0 ? pids[static_cast<std::size_t>(late)] : 0);
    const double t0 = now_seconds();
    t.reset();  // the orderly close
    took = now_seconds() - t0;
  }
  CAPTURE(took);
  CHECK(took < kCloseSeconds + kMarginSeconds);
  if (rank != late) resume_last_rank_after_others(pids, 78);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace dtrain_test_rma_deadline_test
