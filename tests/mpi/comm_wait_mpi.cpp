// Kernel waits on the counters of MPI's node-shared window (mpiexec -n 2): a rank blocked on a
// partner's counter is woken by the partner process's publish (not by a slice timeout), many
// hand-offs between the two processes lose no wake-up, and the shm all-reduce with those waits
// matches MPI_Allreduce.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/futex_wait.hpp>
#include <dtrain/transports/mpi.hpp>

#include "support/skip.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_wait_mpi {

using namespace dtrain;
using detail::counter_publish;
using detail::counter_wait;
using detail::counter_waiters;

namespace {
int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}
}  // namespace

TEST_CASE("a rank blocked on a partner's shared counter is woken by the partner's publish") {
  if (world_size() != 2) return;
  MpiTransport t(MPI_COMM_WORLD);
  SharedSegments* seg = t.shared_segments();
  if (seg == nullptr)
    test::skip_process("node-shared segments (DTRAIN_SHM is 0 or no shared window)");
  const int r = t.rank();
  auto& c = seg->flag(1, 0, 0);  // rank 1's counter; rank 0 waits on it
  const std::uint64_t start = c.load();
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) {
    const double t0 = now_seconds();
    // A 30 s slice: only the other process's wake (or a missed one, failing the check) ends it.
    CHECK(counter_wait(c, start + 1, Deadline(60), 0, 30.0));
    CHECK(now_seconds() - t0 < 10.0);
  } else {
    // Publish only once rank 0 announced itself as a kernel waiter.
    const Deadline announce(20);
    while (counter_waiters(c).load() == 0 && !announce.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(counter_waiters(c).load() == 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    counter_publish(c, start + 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(counter_waiters(c).load() == 0);

  // Ping-pong between the processes on both ranks' counters: a lost wake-up fails a wait.
  auto& mine = seg->flag(r, 0, 0);
  auto& theirs = seg->flag(1 - r, 0, 0);
  const std::uint64_t m0 = mine.load(), t0v = theirs.load();
  MPI_Barrier(MPI_COMM_WORLD);
  int failed = 0;
  for (std::uint64_t i = 1; i <= 2000 && !failed; ++i) {
    if (r == 0) counter_publish(mine, m0 + i);
    if (!counter_wait(theirs, t0v + i, Deadline(20), 0, 60)) failed = 1;
    if (r == 1) counter_publish(mine, m0 + i);
  }
  CHECK(failed == 0);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("shm all-reduce over many chunks with kernel waits matches MPI_Allreduce") {
  SharedSegmentConfig cfg = SharedSegmentConfig::from_env();
  cfg.slot_bytes = 1024;
  cfg.slots = 2;
  MpiTransport t(MPI_COMM_WORLD, cfg);
  REQUIRE(t.size() == 2);  // the CTest runs 2 ranks
  if (t.shared_segments() == nullptr)
    test::skip_process("node-shared segments (DTRAIN_SHM is 0 or no shared window)");
  Communicator comm(t);
  const std::size_t n = 100000;  // about 390 chunks
  std::vector<int> x(n), want(n), got(n, -1);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<int>((i * 31 + t.rank() * 7) % 1000);
  MPI_Allreduce(x.data(), want.data(), static_cast<int>(n), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  for (int call = 0; call < 3; ++call) {
    comm.allreduce(BufferView(span<const int>(x)), BufferView(span<int>(got)), ReduceOp::sum,
                   AllreduceAlgorithm::shm);
    CHECK(got == want);
  }
}

}  // namespace dtrain_test_comm_wait_mpi
