// The one-sided protocol over loopback RMA (threads): point-to-point semantics on both paths
// (eager slots, zero-copy writes), flow control, the registration cache, every collective
// against an independent serial reference, and the injected faults, each of which must end in
// the right error on every rank within the deadline.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback_rma.hpp>

#include "comm_test_util.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_one_sided_test {

using namespace dtrain;

namespace {

using Req = LoopbackRmaTransport::Request;

// Tiny slots: messages above 64 B take the zero-copy path, and 4 credits run out quickly.
OneSidedConfig tiny() {
  OneSidedConfig c;
  c.slots = 4;
  c.slot_bytes = 128;
  return c;
}

std::vector<unsigned char> pattern(std::size_t n, int seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + seed * 17 + 5);
  return v;
}

void wait(LoopbackRmaTransport& t, Req& q) { REQUIRE(t.wait_until(q, Deadline(30))); }

}  // namespace

TEST_CASE("one-sided: messages on both paths match in order per tag, early and late") {
  const std::size_t sizes[] = {0, 1, 63, 64, 65, 1000, 100000};
  LoopbackRmaWorld world(2);
  std::atomic<int> bad{0};
  run_loopback_rma(world, tiny(), [&](LoopbackRmaTransport& t) {
    CHECK(t.eager_limit() == 64);
    // Tag 1 carries every size twice; tag 2 the same sizes in reverse; receives are posted in
    // the opposite phase order from the sends, so eager messages arrive unexpected and
    // clear-to-send messages arrive before their sends.
    std::vector<std::vector<unsigned char>> out;
    for (int rep = 0; rep < 2; ++rep)
      for (std::size_t n : sizes) out.push_back(pattern(n, rep * 10 + static_cast<int>(n % 7)));
    const std::size_t m = out.size();
    if (t.rank() == 0) {
      std::vector<Req> s1(m), s2(m);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // receiver posts first
      for (std::size_t i = 0; i < m; ++i) t.isend(s1[i], 1, 1, out[i].data(), out[i].size());
      for (std::size_t i = 0; i < m; ++i)
        t.isend(s2[i], 1, 2, out[m - 1 - i].data(), out[m - 1 - i].size());
      for (auto& q : s1) wait(t, q);
      for (auto& q : s2) wait(t, q);
    } else {
      std::vector<std::vector<unsigned char>> in1(m), in2(m);
      std::vector<Req> r1(m), r2(m);
      // Tag 2 receives first (their sends come last), tag 1 after a pause (unexpected).
      for (std::size_t i = 0; i < m; ++i) {
        in2[i].assign(out[m - 1 - i].size(), 0xEE);
        t.irecv(r2[i], 0, 2, in2[i].data(), in2[i].size());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      for (std::size_t i = 0; i < m; ++i) {
        in1[i].assign(out[i].size(), 0xEE);
        t.irecv(r1[i], 0, 1, in1[i].data(), in1[i].size());
      }
      for (auto& q : r1) wait(t, q);
      for (auto& q : r2) wait(t, q);
      for (std::size_t i = 0; i < m; ++i) {
        if (in1[i] != out[i]) ++bad;
        if (in2[i] != out[m - 1 - i]) ++bad;
      }
    }
  });
  CHECK(bad.load() == 0);
}

TEST_CASE("one-sided: a sender waits for credits while the receiver is busy, loses nothing") {
  LoopbackRmaWorld world(3);
  std::atomic<int> bad{0};
  run_loopback_rma(world, tiny(), [&](LoopbackRmaTransport& t) {
    constexpr int kMsgs = 200;
    if (t.rank() != 2) {
      // 200 eager messages against 4 credits: most must wait for credits returned later.
      std::vector<std::uint64_t> v(kMsgs);
      std::vector<Req> s(kMsgs);
      for (int i = 0; i < kMsgs; ++i) {
        v[i] = static_cast<std::uint64_t>(t.rank()) * 1000000 + i;
        t.isend(s[i], 2, 7, &v[i], 8);
      }
      for (auto& q : s) wait(t, q);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::vector<std::uint64_t> got(2 * kMsgs);
      std::vector<Req> r(2 * kMsgs);
      for (int i = 0; i < kMsgs; ++i)
        for (int src = 0; src < 2; ++src) t.irecv(r[2 * i + src], src, 7, &got[2 * i + src], 8);
      for (auto& q : r) wait(t, q);
      for (int i = 0; i < kMsgs; ++i)
        for (int src = 0; src < 2; ++src)
          if (got[2 * i + src] != static_cast<std::uint64_t>(src) * 1000000 + i) ++bad;
    }
  });
  CHECK(bad.load() == 0);
}

TEST_CASE("one-sided: size mismatches and bad peers are errors naming rank and peer") {
  LoopbackRmaWorld world(2);
  CHECK_THROWS_WITH_AS(
      run_loopback_rma(world, tiny(),
                       [&](LoopbackRmaTransport& t) {
                         std::vector<unsigned char> a(200), b(300);
                         Req q;
                         CHECK_THROWS_AS(t.isend(q, t.rank(), 0, a.data(), 1), InvalidArgument);
                         if (t.rank() == 0) {
                           t.isend(q, 1, 3, a.data(), a.size());
                           t.wait_until(q, Deadline(10));
                         } else {
                           t.irecv(q, 0, 3, b.data(), b.size());
                           t.wait_until(q, Deadline(10));
                         }
                       }),
      doctest::Contains("200 B posted here but 300 B on the peer"), TransportError);
}

TEST_CASE("one-sided: a plan registers its buffers once, not on every execution") {
  LoopbackRmaWorld world(2);
  std::vector<std::size_t> counts(2);
  run_loopback_rma(world, OneSidedConfig{}, [&](LoopbackRmaTransport& t) {
    CommConfig c;
    c.timeout_s = 30;
    c.segment_bytes = 64 * 1024;
    Communicator comm(t, c);
    std::vector<float> x(1 << 18, 1.0f), y(x.size());
    auto plan = comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(y)),
                                    ReduceOp::sum, AllreduceAlgorithm::ring);
    plan.execute();
    const std::size_t after_first = t.backend().registrations();
    for (int i = 0; i < 3; ++i) plan.execute();
    counts[static_cast<std::size_t>(t.rank())] = t.backend().registrations() - after_first;
    CHECK(y[12345] == 2.0f);
  });
  CHECK(counts[0] == 0);
  CHECK(counts[1] == 0);
}

namespace {

// Every rank runs every (count, algorithm, dtype, op), alternating in-place and out-of-place,
// and checks its result against the serial reference over all ranks' inputs.
void matrix(int p, const OneSidedConfig& oc, std::size_t segment,
            const std::vector<std::size_t>& counts, const std::vector<AllreduceAlgorithm>& algos,
            const std::vector<DType>& dtypes, const std::vector<ReduceOp>& ops) {
  std::mutex m;
  std::vector<std::string> failures;
  LoopbackRmaWorld world(p);
  run_loopback_rma(world, oc, [&](LoopbackRmaTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    c.segment_bytes = segment;
    Communicator comm(t, c);
    std::uint64_t combo = 7;
    for (std::size_t n : counts)
      for (AllreduceAlgorithm algo : algos)
        for (DType dt : dtypes)
          for (ReduceOp op : ops) {
            ++combo;
            std::vector<std::vector<unsigned char>> inputs;
            for (int r = 0; r < p; ++r) inputs.push_back(test::make_input(dt, op, n, r, combo));
            std::vector<unsigned char> buf = inputs[static_cast<std::size_t>(t.rank())];
            std::vector<unsigned char> out(n * size_of(dt));
            if (combo % 2) {
              comm.allreduce(BufferView(buf.data(), n, dt), op, algo);
              out = buf;
            } else {
              comm.allreduce(BufferView(buf.data(), n, dt), BufferView(out.data(), n, dt), op,
                             algo);
            }
            const long long bad = test::first_mismatch(dt, op, inputs, out.data(), n);
            if (bad >= 0) {
              std::lock_guard<std::mutex> lock(m);
              failures.push_back(detail::concat("p=", p, " rank ", t.rank(), " n=", n, " ",
                                                name_of(algo), " ", name_of(dt), " ", name_of(op),
                                                ": element ", bad));
            }
          }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

const std::vector<AllreduceAlgorithm> kAlgos = {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                                                AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd,
                                                AllreduceAlgorithm::automatic};
const std::vector<DType> kDtypes = {DType::f32, DType::f64, DType::i32,
                                    DType::i64, DType::f16, DType::bf16};
const std::vector<ReduceOp> kOps = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                                    ReduceOp::prod};

}  // namespace

TEST_CASE("one-sided collectives: every algorithm, dtype and op, 1-4 ranks, both paths") {
  // 200-byte segments with 64-byte eager slots: the pipelined algorithms mix eager messages
  // (short tails, fingerprints) and zero-copy writes within one collective.
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    matrix(p, tiny(), 200, {0, 1, 7, 1000}, kAlgos, kDtypes, kOps);
  }
}

TEST_CASE("one-sided collectives: a multi-segment count with default slots") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    matrix(p, OneSidedConfig{}, 16 * 1024, {(1u << 17) + 3}, kAlgos, {DType::f32, DType::bf16},
           {ReduceOp::sum, ReduceOp::avg});
  }
}

namespace {

struct Outcome {
  std::string type;  // "ok", "TransportError", "TimeoutError", "RemoteError", "other"
  std::string what;
  double seconds = 0;
};

// Runs allreduce loops on p ranks with `fault` injected and a deadline of `timeout_s` (2 s, or
// 1 s where the fault is waited out); returns what each rank ended with and how long it took.
std::vector<Outcome> run_with_fault(int p, const LoopbackRmaFault& fault, double timeout_s = 2) {
  LoopbackRmaWorld world(p);
  world.inject(fault);
  std::vector<Outcome> out(static_cast<std::size_t>(p));
  try {
    run_loopback_rma(world, tiny(), [&](LoopbackRmaTransport& t) {
      Outcome& o = out[static_cast<std::size_t>(t.rank())];
      const Timer timer;
      try {
        CommConfig c;
        c.timeout_s = timeout_s;
        c.segment_bytes = 200;
        Communicator comm(t, c);
        std::vector<float> x(3000, 1.0f);
        for (int i = 0; i < 20; ++i)
          comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
        o.type = "ok";
      } catch (const TransportError& e) {
        o = {"TransportError", e.what()};
      } catch (const TimeoutError& e) {
        o = {"TimeoutError", e.what()};
      } catch (const RemoteError& e) {
        o = {"RemoteError", e.what()};
      } catch (const std::exception& e) {
        o = {"other", e.what()};
      }
      o.seconds = timer.seconds();
      if (o.type != "ok") throw TransportError(o.what);  // aborts the world for the others
    });
  } catch (const Error&) {
  }
  for (int r = 0; r < p; ++r) {
    const Outcome& o = out[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << o.type << ": " << o.what << " after " << o.seconds << " s");
    CHECK(o.type != "ok");
    CHECK(o.type != "other");
    CHECK(o.seconds < timeout_s + 4);  // the deadline plus the communicator's own exchanges
  }
  return out;
}

bool has(const Outcome& o, const char* s) { return o.what.find(s) != std::string::npos; }

}  // namespace

TEST_CASE("one-sided faults: a remote access error fails the writer and flushes its peer") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    const auto o = run_with_fault(p, {LoopbackRmaFault::Kind::remote_access_error, 0, 1, 5});
    CHECK(o[0].type == "TransportError");
    CHECK(has(o[0], "rank 0: one-sided loopback-rma write to rank 1"));
    CHECK(has(o[0], "remote access error"));
    CHECK(o[1].type == "TransportError");
    CHECK(has(o[1], "rank 1: one-sided loopback-rma write to rank 0"));
    CHECK(has(o[1], "flushed"));
  }
}

TEST_CASE("one-sided faults: a flushed queue fails both ends of the connection") {
  const auto o = run_with_fault(2, {LoopbackRmaFault::Kind::flushed_queue, 1, 0, 3});
  CHECK(o[1].type == "TransportError");
  CHECK(has(o[1], "injected: connection in error state"));
  CHECK(o[0].type == "TransportError");
  CHECK(has(o[0], "flushed"));
}

TEST_CASE("one-sided faults: a peer that stops granting credits ends in a timeout") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    const auto o = run_with_fault(p, {LoopbackRmaFault::Kind::stop_credits, 1, 0, 2}, 1);
    // Rank 0 cannot send to rank 1 any more and rank 1 waits for it: whichever deadline passes
    // first raises a TimeoutError naming the collective and the peer; the others learn of it.
    int timeouts = 0;
    for (const auto& x : o) {
      CHECK((x.type == "TimeoutError" || x.type == "RemoteError"));
      if (x.type == "TimeoutError") {
        ++timeouts;
        CHECK(has(x, ": allreduce"));
        CHECK(has(x, "timed out after 1 s"));
      }
    }
    CHECK(timeouts >= 1);
  }
}

TEST_CASE("one-sided faults: a lost notification is detected by its successor") {
  const auto o = run_with_fault(2, {LoopbackRmaFault::Kind::lost_notification, 0, 1, 4});
  CHECK(o[1].type == "TransportError");
  CHECK(has(o[1], "rank 1: one-sided loopback-rma receive from rank 0"));
  CHECK(has(o[1], "lost, duplicated or is stale"));
  CHECK((o[0].type == "RemoteError" || o[0].type == "TimeoutError"));
}

}  // namespace dtrain_test_one_sided_test
