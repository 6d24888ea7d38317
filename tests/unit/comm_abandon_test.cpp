// Abandonment over loopback: the polled Deadline's descheduling and abandon flag, a collective
// handle dropped while an error unwinds (ends at once instead of waiting out the deadline), and
// a timed-out collective whose late peer arrives after the buffers were freed (run under ASan in
// CI: a use after free there is a failure).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_abandon_test {

using namespace dtrain;

namespace {
void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// A transport stand-in whose ranks' processes are given: what timeout_detail reads.
struct FakeNode {
  int me = 0;
  std::vector<detail::PeerStatus> status;
  int rank() const { return me; }
  int size() const { return static_cast<int>(status.size()); }
  detail::PeerStatus peer_status(int q) const { return status[static_cast<std::size_t>(q)]; }
};

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

CommConfig quick(double timeout_s, bool progress_thread) {
  CommConfig c;
  c.timeout_s = timeout_s;
  c.segment_bytes = 256;
  c.progress = progress_thread ? CommProgress::thread : CommProgress::caller;
  return c;
}
}  // namespace

TEST_CASE("a polled deadline moves back by a gap in which its thread did not run") {
  const double t0 = now_seconds();
  Deadline d = Deadline::polled(0.5);
  CHECK_FALSE(d.expired());
  sleep_s(1.3);  // as if the process had been stopped in the middle of its wait
  CHECK_FALSE(d.expired());
  CHECK(d.descheduled_seconds() >= 1.2);
  CHECK(d.longest_gap() >= 1.2);
  while (!d.expired()) sleep_s(1e-3);
  const double waited = now_seconds() - t0;
  CHECK(waited >= 1.7);  // 0.5 s of its own plus the 1.3 s lost
  CHECK(waited < 3.0);

  // A plain deadline does not track gaps (its waits may block for the whole remaining time).
  Deadline plain(0.5);
  sleep_s(0.7);
  CHECK(plain.expired());
  CHECK(plain.descheduled_seconds() == 0);

  // The extension is bounded (kMaxExtensionBudgets budgets: 0.8 s here).
  Deadline capped = Deadline::polled(0.2);
  sleep_s(1.2);
  CHECK(capped.expired());
  CHECK(capped.descheduled_seconds() >= 1.1);
}

TEST_CASE("a polled deadline ends at once when its abandon flag is set") {
  std::atomic<bool> flag{false};
  Deadline d = Deadline::polled(30, &flag);
  CHECK_FALSE(d.expired());
  CHECK(d.remaining() > 29);
  flag = true;
  CHECK(d.abandoned());
  CHECK(d.expired());
  CHECK(d.remaining() == 0);
}

TEST_CASE("a collective handle dropped while an error unwinds does not wait out the deadline") {
  for (const bool threaded : {true, false}) {
    CAPTURE(threaded);
    std::atomic<double> unwind_s{-1};
    std::atomic<bool> refused{false};
    run_loopback(2, [&](LoopbackTransport& t) {
      Communicator comm(t, quick(20, threaded));
      if (t.rank() == 1) return;  // never joins: rank 0's collective cannot complete
      std::vector<float> x(1000, 1.0f);
      const double t0 = now_seconds();
      try {
        CollectiveHandle h =
            comm.iallreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
        throw std::runtime_error("local failure");
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == "local failure");
      }
      unwind_s = now_seconds() - t0;
      // The abandoned communicator refuses further work.
      try {
        comm.barrier();
      } catch (const RemoteError&) {
        refused = true;
      }
    });
    CHECK(unwind_s.load() >= 0);
    CHECK(unwind_s.load() < 5);  // not the 20 s deadline
    CHECK(refused.load());
  }
}

TEST_CASE("a late peer arriving after a timeout finds no freed buffer of the rank that gave up") {
  // Rank 0 times out, frees its buffers and the communicator, and reuses the heap while rank 1,
  // late, runs the same collective against it; rank 1 then times out too. Under ASan any write
  // into rank 0's freed memory fails the test.
  std::atomic<int> timeouts{0};
  run_loopback(2, [&](LoopbackTransport& t) {
    {
      Communicator comm(t, quick(0.4, true));
      std::vector<float> x(20000, 1.0f);
      if (t.rank() == 1) sleep_s(0.8);  // past rank 0's deadline
      try {
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
      } catch (const TimeoutError& e) {
        ++timeouts;
        CHECK(std::string(e.what()).find("wait for rank " + std::to_string(1 - t.rank())) !=
              std::string::npos);
      } catch (const RemoteError&) {
        ++timeouts;  // rank 1 may meet rank 0's fingerprint and fail in the data phase instead
      }
    }
    if (t.rank() == 0) {
      std::vector<std::vector<float>> reuse;
      for (int k = 0; k < 8; ++k) reuse.emplace_back(20000, 2.0f);
      sleep_s(1.0);  // while rank 1 runs its late collective
      for (const auto& v : reuse) CHECK(v[v.size() / 2] == 2.0f);
    }
  });
  CHECK(timeouts.load() == 2);
}

TEST_CASE("process_status tells a running, a stopped and an exited process apart") {
  const detail::ProcessId self = detail::self_process_id();
  REQUIRE(self.pid == static_cast<long long>(getpid()));
  CHECK(detail::process_status(self).state == detail::PeerState::running);
  CHECK(detail::process_status(detail::ProcessId{}).state == detail::PeerState::unknown);
  // The same pid with another start time is another process (pid reuse): gone.
  CHECK(detail::process_status({self.pid, self.start + 1}).state == detail::PeerState::gone);

  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (;;) pause();
  }
  detail::ProcessId id{};
  const double t0 = now_seconds();
  char state = 0;
  while (!detail::read_proc_stat(child, state, id.start) && now_seconds() - t0 < 5) sleep_s(0.01);
  id.pid = child;
  CHECK(detail::process_status(id).state == detail::PeerState::running);
  kill(child, SIGSTOP);
  int wst = 0;
  waitpid(child, &wst, WUNTRACED);
  const detail::PeerStatus stopped = detail::process_status(id);
  CHECK(stopped.state == detail::PeerState::stopped);
  CHECK(has(detail::describe_peer(3, stopped),
            "rank 3 (pid " + std::to_string(child) + " on this node) is stopped (state T"));
  kill(child, SIGCONT);
  kill(child, SIGKILL);
  waitpid(child, &wst, 0);
  const detail::PeerStatus gone = detail::process_status(id);
  CHECK(gone.state == detail::PeerState::gone);
  CHECK(has(detail::describe_peer(3, gone),
            "rank 3 (pid " + std::to_string(child) + " on this node) has exited"));
}

TEST_CASE("a timeout message puts the root cause first") {
  using detail::PeerState;
  using detail::PeerStatus;
  const Deadline d = Deadline::polled(6);
  FakeNode node;
  node.me = 0;
  node.status = {PeerStatus{}, PeerStatus{PeerState::running, 101, 'S'},
                 PeerStatus{PeerState::stopped, 102, 'T'}};
  // Waiting for the stopped rank itself.
  std::string m = detail::timeout_detail(node, 2, d);
  CAPTURE(m);
  CHECK(m.rfind("wait for rank 2 timed out after 6 s: rank 2 (pid 102 on this node) is stopped",
                0) == 0);
  // Waiting for a live rank that waits for the stopped one: the stopped one comes first.
  m = detail::timeout_detail(node, 1, d);
  CHECK(m.rfind("rank 2 (pid 102 on this node) is stopped", 0) == 0);
  CHECK(has(m,
            "; wait for rank 1 timed out after 6 s (rank 1 is alive, probably waiting for "
            "rank 2)"));
  // A rank on another node: nothing is claimed beyond the missing progress.
  node.status[2] = PeerStatus{};
  m = detail::timeout_detail(node, 2, d);
  CHECK(m ==
        "wait for rank 2 timed out after 6 s: no progress from rank 2 (it runs on another "
        "node, or its process is not known here)");
  // This rank's own descheduling comes before anything said about the peer.
  Deadline late = Deadline::polled(0.5);
  sleep_s(1.2);
  CHECK_FALSE(late.expired());
  m = detail::timeout_detail(node, 1, late);
  CHECK(m.rfind("this rank itself did not run for 1.", 0) == 0);
  CHECK(has(m, "so rank 1 is not known to be at fault; wait for rank 1 timed out"));
}

TEST_CASE("a rank that did not run just before its wait says it arrived late") {
  using detail::PeerState;
  using detail::PeerStatus;
  FakeNode node;
  node.me = 1;
  node.status = {PeerStatus{PeerState::running, 100, 'S'}, PeerStatus{}};
  const std::string blame =
      "wait for rank 0 timed out after 2 s: rank 0 (pid 100 on this node) is alive";
  // A stop of 5 s that ended 0.5 s before the wait: the peers' 2 s budget ran out meanwhile.
  detail::RunGapWatch::record(5.0, now_seconds() - 0.5);
  std::string m = detail::timeout_detail(node, 0, Deadline::polled(2));
  CAPTURE(m);
  CHECK(m.rfind("this rank itself did not run for 5.0 s, until 0.5 s before this wait began", 0) ==
        0);
  CHECK(has(m,
            "probably arrived after its peers had given up waiting for it and rank 0 is not "
            "known to be at fault; " +
                blame));
  // A gap too short to exhaust a peer's budget, or one long past, says nothing.
  detail::RunGapWatch::record(1.5, now_seconds() - 0.1);
  m = detail::timeout_detail(node, 0, Deadline::polled(4));
  CHECK(m.rfind("wait for rank 0 timed out after 4 s", 0) == 0);
  detail::RunGapWatch::record(5.0, now_seconds() - 30);
  m = detail::timeout_detail(node, 0, Deadline::polled(2));
  CHECK(m.rfind(blame, 0) == 0);
  detail::RunGapWatch::record(0, 0);  // as if no gap was ever recorded
}

TEST_CASE("the run-gap watch records a stop of its process") {
  // A child process starts its own watch (it does not inherit the parent's thread), is stopped
  // for 2 s, and reports through its exit code whether its watch saw the gap.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    detail::RunGapWatch::record(0, 0);  // forget what the parent's watch may have seen
    detail::RunGapWatch::start();
    const double t0 = now_seconds();
    while (detail::RunGapWatch::last().seconds <= 0 && now_seconds() - t0 < 20) sleep_s(0.05);
    const detail::RunGapWatch::Gap g = detail::RunGapWatch::last();
    _exit(g.seconds > 1.2 && g.seconds < 10 && g.ended > t0 ? 0 : 1);
  }
  sleep_s(0.6);  // the child's watch has ticked by now
  kill(child, SIGSTOP);
  int wst = 0;
  waitpid(child, &wst, WUNTRACED);
  sleep_s(2.0);
  kill(child, SIGCONT);
  REQUIRE(waitpid(child, &wst, 0) == child);
  CHECK(WIFEXITED(wst));
  CHECK(WEXITSTATUS(wst) == 0);
}

}  // namespace dtrain_test_comm_abandon_test
