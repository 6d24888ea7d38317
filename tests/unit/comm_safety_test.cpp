// Collectives over loopback: fingerprints, deadlines, non-blocking progress, plans, the cost
// model, the tree shapes and the transport traits.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/any_transport.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/detail/fingerprint.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_safety_test {

using namespace dtrain;

namespace {
// The progress thread these tests exercise, whatever the machine's cores (automatic would choose
// the caller's thread for several ranks on few cores). A fixed default algorithm: `automatic`
// would calibrate first (seconds with threads as ranks on few cores), and what these tests check
// does not depend on the algorithm; the calibration has its own cases below and in
// comm_calibration_test.cpp.
CommConfig quick(double timeout_s = 30) {
  CommConfig c;
  c.timeout_s = timeout_s;
  c.segment_bytes = 256;
  c.progress = CommProgress::thread;
  c.default_algorithm = AllreduceAlgorithm::ring;
  return c;
}

struct NotATransport {
  int rank() const { return 0; }
};
}  // namespace

static_assert(is_transport_v<LoopbackTransport>, "loopback must satisfy the transport traits");
static_assert(!is_transport_v<NotATransport>, "incomplete types must be rejected");
static_assert(!transport_capabilities<LoopbackTransport>::supports_device_memory, "");

TEST_CASE("mismatched collectives raise on every rank, naming both calls") {
  std::mutex m;
  std::vector<std::string> messages(3);
  std::atomic<int> remote_errors{0};
  const double t0 = now_seconds();
  run_loopback(3, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(20));
    std::vector<float> x(100, 1.0f);
    try {
      if (t.rank() == 1)
        comm.broadcast(BufferView(span<float>(x)), 0);
      else
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
    } catch (const RemoteError& e) {
      ++remote_errors;
      std::lock_guard<std::mutex> lock(m);
      messages[t.rank()] = e.what();
    }
  });
  CHECK(now_seconds() - t0 < 10);  // detected, not timed out
  CHECK(remote_errors.load() == 3);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(messages[r]);
    CHECK(messages[r].find("rank " + std::to_string(r) + ":") != std::string::npos);
    CHECK(messages[r].find("mismatched collective calls") != std::string::npos);
    CHECK(messages[r].find("broadcast #0 (root 0, f32, 100 elements)") != std::string::npos);
    CHECK(messages[r].find("allreduce #0 (ring, sum, f32, 100 elements)") != std::string::npos);
  }
}

namespace {
// Runs p ranks, each making the call calls(rank) names ("broadcast", "allreduce", or
// "allreduce99" for 99 elements), with node-shared segments on (the segment check, p <= 8) or
// off (message rounds); returns each rank's mismatch report (from "mismatched" on, without the
// rank's own prefix), empty where a rank raised nothing.
template <class Calls>
std::vector<std::string> mismatch_reports(int p, bool segments, Calls calls) {
  std::mutex m;
  std::vector<std::string> out(static_cast<std::size_t>(p));
  std::atomic<int> wrong_path{0};
  SharedSegmentConfig sc;
  sc.enabled = segments;
  LoopbackWorld world(p, sc);
  run_loopback(world, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(20));
    if ((node_segments_of(t) != nullptr) != segments) ++wrong_path;
    std::vector<float> x(100, 1.0f);
    const std::string call = calls(t.rank());
    try {
      if (call == "broadcast")
        comm.broadcast(BufferView(span<float>(x)), 0);
      else
        comm.allreduce(BufferView(x.data(), call == "allreduce99" ? 99 : 100, DType::f32),
                       ReduceOp::sum, AllreduceAlgorithm::ring);
    } catch (const RemoteError& e) {
      const std::string what = e.what();
      const std::size_t at = what.find("mismatched collective calls");
      std::lock_guard<std::mutex> lock(m);
      out[static_cast<std::size_t>(t.rank())] = at == std::string::npos ? what : what.substr(at);
    }
  });
  CHECK(wrong_path.load() == 0);
  return out;
}

const char* const kBcast = "broadcast #0 (root 0, f32, 100 elements)";
const char* const kAllreduce = "allreduce #0 (ring, sum, f32, 100 elements)";
const char* const kAllreduce99 = "allreduce #0 (ring, sum, f32, 99 elements)";
}  // namespace

TEST_CASE("a mismatch report names the odd rank against the majority, on both check paths") {
  // One rank (the first, a middle one, the last) calls broadcast, the others allreduce: every rank
  // raises the same report, the odd rank first and the majority last.
  struct Case {
    int p, odd;
    const char* majority;
  };
  for (const bool segments : {false, true}) {
    for (const Case k :
         {Case{3, 0, "ranks 1, 2"}, Case{3, 1, "ranks 0, 2"}, Case{3, 2, "ranks 0, 1"},
          Case{4, 0, "ranks 1-3"}, Case{4, 2, "ranks 0, 1, 3"}, Case{4, 3, "ranks 0-2"}}) {
      CAPTURE(segments);
      CAPTURE(k.p);
      CAPTURE(k.odd);
      const auto reports = mismatch_reports(
          k.p, segments, [&](int r) { return r == k.odd ? "broadcast" : "allreduce"; });
      const std::string expected = "mismatched collective calls: rank " + std::to_string(k.odd) +
                                   " called " + kBcast + "; " + k.majority + " called " +
                                   kAllreduce;
      for (int r = 0; r < k.p; ++r) {
        CAPTURE(r);
        CHECK(reports[static_cast<std::size_t>(r)] == expected);
      }
    }
  }
}

TEST_CASE("a mismatch report with two groups of two, or three different calls") {
  for (const bool segments : {false, true}) {
    CAPTURE(segments);
    // 2-2: no majority, the groups in the order of their lowest ranks.
    auto reports = mismatch_reports(
        4, segments, [](int r) { return r == 1 || r == 3 ? "broadcast" : "allreduce"; });
    std::string expected = std::string(
                               "mismatched collective calls (no majority): ranks 0, 2 "
                               "called ") +
                           kAllreduce + "; ranks 1, 3 called " + kBcast;
    for (const std::string& rep : reports) CHECK(rep == expected);
    // Three calls: the two single ranks (lowest first), then the majority.
    reports = mismatch_reports(4, segments, [](int r) {
      return r == 3 ? "broadcast" : r == 1 ? "allreduce99" : "allreduce";
    });
    expected = std::string("mismatched collective calls: rank 1 called ") + kAllreduce99 +
               "; rank 3 called " + kBcast + "; ranks 0, 2 called " + kAllreduce;
    for (const std::string& rep : reports) CHECK(rep == expected);
  }
}

TEST_CASE("fingerprint check states merge as sets: idempotent, in any order, bounded") {
  using detail::CheckState;
  auto fp = [](std::uint64_t count) {
    return detail::make_fingerprint(detail::CollectiveKind::allreduce, 7, count, DType::f32,
                                    ReduceOp::sum, AllreduceAlgorithm::ring, -1);
  };
  auto same = [](const CheckState& a, const CheckState& b) {
    return std::memcmp(&a, &b, sizeof(CheckState)) == 0;
  };
  // The state travels with every checked collective: a small, fixed size.
  CHECK(sizeof(CheckState) == 216);

  // Ranks 0-5 with counts 10, 20, 10, 30, 10, 20: three calls, each with its ranks.
  const std::uint64_t counts[] = {10, 20, 10, 30, 10, 20};
  std::vector<CheckState> own;
  for (int r = 0; r < 6; ++r) own.push_back(CheckState::of(fp(counts[r]), r));
  CheckState fwd = own[0];
  for (int r = 1; r < 6; ++r) fwd.merge(own[static_cast<std::size_t>(r)]);
  CheckState bwd = own[5];
  for (int r = 4; r >= 0; --r) bwd.merge(own[static_cast<std::size_t>(r)]);
  CheckState halves = own[3];  // (3 4 5) merged with (1 0 2), overlapping once more with rank 2
  halves.merge(own[4]);
  halves.merge(own[5]);
  halves.merge(own[2]);
  CheckState other = own[1];
  other.merge(own[0]);
  other.merge(own[2]);
  halves.merge(other);
  CHECK(same(fwd, bwd));
  CHECK(same(fwd, halves));
  CheckState twice = fwd;
  twice.merge(fwd);
  twice.merge(own[4]);
  CHECK(same(twice, fwd));
  CHECK(fwd.mismatch());
  CHECK(fwd.calls == 3);
  CHECK(fwd.more == 0);
  CHECK(fwd.report(6) ==
        "mismatched collective calls: rank 3 called allreduce #7 (ring, sum, f32, 30 elements); "
        "ranks 1, 5 called allreduce #7 (ring, sum, f32, 20 elements); ranks 0, 2, 4 called "
        "allreduce #7 (ring, sum, f32, 10 elements)");

  // One call everywhere: no mismatch, and merging changes nothing but the ranks.
  CheckState one = CheckState::of(fp(10), 0);
  one.merge(CheckState::of(fp(10), 1));
  CHECK(!one.mismatch());
  CHECK(one.ranks[0][0] == 3u);

  // Five calls: the first three in byte order are kept with all their ranks, the others become
  // "other collectives", whatever the order.
  std::vector<CheckState> five;
  for (int r = 0; r < 7; ++r) five.push_back(CheckState::of(fp(1 + r % 5), r));
  CheckState a = five[0], b = five[6];
  for (int r = 1; r < 7; ++r) a.merge(five[static_cast<std::size_t>(r)]);
  for (int r = 5; r >= 0; --r) b.merge(five[static_cast<std::size_t>(r)]);
  CHECK(same(a, b));
  CHECK(a.calls == 3);
  CHECK(a.more == 1);
  CHECK(a.report(7) ==
        "mismatched collective calls: rank 2 called allreduce #7 (ring, sum, f32, 3 elements); "
        "ranks 0, 5 called allreduce #7 (ring, sum, f32, 1 elements); ranks 1, 6 called "
        "allreduce #7 (ring, sum, f32, 2 elements); ranks 3, 4 called other collectives");

  // Beyond the masks' 256 ranks each call is named with its lowest rank.
  CheckState big = CheckState::of(fp(10), 300);
  big.merge(CheckState::of(fp(20), 280));
  big.merge(CheckState::of(fp(10), 2));
  CHECK(big.report(400) ==
        "mismatched collective calls among 400 ranks (each call named with the lowest rank that "
        "made it): rank 2 called allreduce #7 (ring, sum, f32, 10 elements); rank 280 called "
        "allreduce #7 (ring, sum, f32, 20 elements)");
}

TEST_CASE("the fingerprint check through the node's segments and through messages alike") {
  // Up to 8 ranks with segments: one hand-off through them (each checked call one check line);
  // without segments, or with more ranks: message rounds. Both name both calls on every rank,
  // and both are barriers.
  struct Case {
    int p;
    bool segments;
    bool via_segments;
  };
  for (const Case k : {Case{3, true, true}, Case{3, false, false}, Case{10, true, false}}) {
    CAPTURE(k.p);
    CAPTURE(k.segments);
    SharedSegmentConfig sc;
    sc.enabled = k.segments;
    LoopbackWorld world(k.p, sc);
    std::atomic<int> named{0}, wrong_checks{0}, early{0}, arrived{0};
    run_loopback(world, [&](LoopbackTransport& t) {
      Communicator comm(t, quick(20));
      const SharedSegments* w = node_segments_of(t);
      const std::uint64_t before = w ? w->next_check : 0;
      std::vector<float> x(100, 1.0f);
      comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
      arrived.fetch_add(1);
      comm.barrier();
      if (arrived.load() != k.p) ++early;
      const std::uint64_t checks = w ? w->next_check - before : 0;
      if (checks != (k.via_segments ? 2u : 0u)) ++wrong_checks;
      try {
        if (t.rank() == k.p - 1)
          comm.broadcast(BufferView(span<float>(x)), 0);
        else
          comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
      } catch (const RemoteError& e) {
        const std::string what = e.what();
        if (what.find("mismatched collective calls") != std::string::npos &&
            what.find("broadcast #2 (root 0, f32, 100 elements)") != std::string::npos &&
            what.find("allreduce #2 (ring, sum, f32, 100 elements)") != std::string::npos)
          ++named;
      }
    });
    CHECK(named.load() == k.p);
    CHECK(wrong_checks.load() == 0);
    CHECK(early.load() == 0);
  }
}

TEST_CASE("different counts or a skipped call are mismatches too") {
  std::atomic<int> errors{0};
  run_loopback(4, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(20));
    std::vector<double> x(64, 1.0);
    const std::size_t n = t.rank() == 2 ? 63 : 64;
    try {
      comm.allreduce(BufferView(x.data(), n, DType::f64), ReduceOp::sum);
    } catch (const RemoteError& e) {
      if (std::string(e.what()).find("63 elements") != std::string::npos) ++errors;
    }
  });
  CHECK(errors.load() == 4);

  std::atomic<int> seq_errors{0};
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(20));
    std::vector<int> x(8, 1);
    try {
      if (t.rank() == 0) comm.barrier();  // rank 1 skips it
      comm.allreduce(BufferView(span<int>(x)), ReduceOp::sum, AllreduceAlgorithm::rd);
      if (t.rank() == 1) comm.barrier();
    } catch (const RemoteError& e) {
      const std::string w = e.what();
      if (w.find("barrier #0") != std::string::npos && w.find("allreduce #0") != std::string::npos)
        ++seq_errors;
    }
  });
  CHECK(seq_errors.load() == 2);
}

TEST_CASE(
    "a plan made without the fingerprint check skips it; GradientSync checks its first bucket") {
  // Same sizes, different ops: only the fingerprint tells them apart. Checked plans raise on both
  // ranks; unchecked ones run (the result is meaningless, which is why only a group's later plans
  // skip the check).
  std::atomic<int> checked_errors{0}, unchecked_errors{0};
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(20));
    std::vector<float> x(64, 1.0f);
    const ReduceOp op = t.rank() == 0 ? ReduceOp::sum : ReduceOp::max;
    const BufferView v{span<float>(x)};
    auto unchecked = comm.plan_allreduce(v, v, op, AllreduceAlgorithm::ring, false);
    auto checked = comm.plan_allreduce(v, v, op, AllreduceAlgorithm::ring, true);
    try {
      unchecked.execute();
    } catch (const RemoteError&) {
      ++unchecked_errors;
    }
    try {
      checked.execute();
    } catch (const RemoteError& e) {
      if (std::string(e.what()).find("mismatched collective calls") != std::string::npos)
        ++checked_errors;
    }
  });
  CHECK(unchecked_errors.load() == 0);
  CHECK(checked_errors.load() == 2);

  // A rank one collective ahead of the other is caught at the first bucket of the step.
  std::atomic<int> step_errors{0};
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(20));
    std::vector<float> grads(1000, 1.0f);
    GradientSync sync(comm, BufferView(span<float>(grads)), 256 * sizeof(float),
                      AllreduceAlgorithm::ring);
    REQUIRE(sync.bucket_count() == 4);
    sync.sync_all();  // a correct step
    std::vector<float> extra(8, 1.0f);
    try {
      if (t.rank() == 1) comm.allreduce(BufferView(span<float>(extra)), ReduceOp::sum);
      sync.sync_all();
    } catch (const RemoteError& e) {
      if (std::string(e.what()).find("mismatched collective calls") != std::string::npos)
        ++step_errors;
    }
  });
  CHECK(step_errors.load() == 2);
}

TEST_CASE("a rank that never calls produces TimeoutError naming rank, collective, seq and peer") {
  std::mutex m;
  std::vector<std::string> messages;
  const double t0 = now_seconds();
  run_loopback(3, [&](LoopbackTransport& t) {
    Communicator comm(t, quick(0.3));
    std::vector<float> x(1000, 1.0f);
    comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
    if (t.rank() == 2) return;  // never calls the second one
    try {
      comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
    } catch (const TimeoutError& e) {
      std::lock_guard<std::mutex> lock(m);
      messages.push_back(e.what());
    }
    // The failed communicator refuses further work instead of corrupting data.
    CHECK_THROWS_AS(comm.barrier(), RemoteError);
  });
  CHECK(now_seconds() - t0 < 5);
  REQUIRE(messages.size() == 2);
  for (const auto& msg : messages) {
    CAPTURE(msg);
    CHECK(msg.find("allreduce #1 (ring, 4000 B)") != std::string::npos);
    CHECK(msg.find("wait for rank 2 timed out after 0.3 s") != std::string::npos);
  }
}

TEST_CASE("non-blocking collectives progress while the caller computes") {
  run_loopback(4, [&](LoopbackTransport& t) {
    Communicator comm(t, quick());
    REQUIRE(comm.has_progress_thread());
    std::vector<std::vector<float>> bufs(3, std::vector<float>(5000));
    for (int k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < 5000; ++i) bufs[k][i] = static_cast<float>(t.rank() + k + i % 3);
    std::vector<CollectiveHandle> hs;
    for (int k = 0; k < 3; ++k)
      hs.push_back(comm.iallreduce(BufferView(span<float>(bufs[k])), ReduceOp::sum));
    // The caller never enters the library: completion can only come from the progress thread.
    const double t0 = now_seconds();
    while (!hs[2].test() && now_seconds() - t0 < 20)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(now_seconds() - t0 < 20);
    for (auto& h : hs) h.wait();
    for (int k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < 5000; i += 97)
        CHECK(bufs[k][i] == static_cast<float>(6 + 4 * k + 4 * (i % 3)));
    // A blocking call after started ones runs after them.
    std::vector<double> y(10, 1.0);
    auto h = comm.ibroadcast(BufferView(span<double>(y)), 0);
    comm.allreduce(BufferView(span<double>(y)), ReduceOp::sum);
    h.wait();
    CHECK(y[3] == 4.0);
  });
}

TEST_CASE("automatic progress: a thread only where the rank has a core to spare") {
  // Unbound ranks share the machine's CPUs: a thread needs two per rank.
  CHECK(detail::progress_thread_pays(2, 2, 1));
  CHECK_FALSE(detail::progress_thread_pays(2, 2, 2));
  CHECK_FALSE(detail::progress_thread_pays(64, 64, 64));
  CHECK(detail::progress_thread_pays(64, 64, 32));
  CHECK_FALSE(detail::progress_thread_pays(64, 64, 33));
  // A rank bound to its own CPUs by the launcher has them all, however many ranks the node runs.
  CHECK(detail::progress_thread_pays(8, 64, 8));
  CHECK(detail::progress_thread_pays(2, 64, 64));
  CHECK_FALSE(detail::progress_thread_pays(1, 64, 1));
  // Unknown counts: the thread, as before automatic existed.
  CHECK(detail::progress_thread_pays(0, 0, 4));
  // The communicator follows the rule with its node's rank count; explicit settings win.
  for (int p : {1, 2, 3}) {
    CAPTURE(p);
    const bool pays =
        detail::progress_thread_pays(detail::affinity_cpus(), detail::online_cpus(), p);
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c = quick();
      c.progress = CommProgress::automatic;
      Communicator automatic(t, c);
      CHECK(automatic.has_progress_thread() == pays);
      c.progress = CommProgress::caller;
      Communicator caller(t, c);
      CHECK_FALSE(caller.has_progress_thread());
      c.progress = CommProgress::thread;
      Communicator thread(t, c);
      CHECK(thread.has_progress_thread());
      // Either way the collectives complete and agree.
      std::vector<double> x(1000, t.rank() + 1.0);
      automatic.allreduce(BufferView(span<double>(x)), ReduceOp::sum);
      CHECK(x[999] == p * (p + 1) / 2.0);
    });
  }
}

TEST_CASE("without a progress thread, test() and wait() drive the collectives") {
  run_loopback(3, [&](LoopbackTransport& t) {
    CommConfig c = quick();
    c.progress = CommProgress::caller;
    Communicator comm(t, c);
    CHECK_FALSE(comm.has_progress_thread());
    std::vector<std::int32_t> a(77, t.rank() + 1), b(5, 2);
    auto h1 = comm.iallreduce(BufferView(span<std::int32_t>(a)), ReduceOp::prod);
    auto h2 = comm.iallreduce(BufferView(span<std::int32_t>(b)), ReduceOp::max);
    h2.wait();  // runs h1 first, in issue order
    CHECK(h1.test());
    CHECK(a[10] == 6);
    CHECK(b[0] == 2);
  });
}

TEST_CASE("plans execute many times and resolve automatic once") {
  run_loopback(3, [&](LoopbackTransport& t) {
    CommConfig c = quick();
    c.default_algorithm = AllreduceAlgorithm::automatic;
    Communicator comm(t, c);
    comm.set_cost_model(CostModel{5e-6, 1.0 / 10e9, 1.0 / 20e9});  // given: no calibration
    std::vector<double> x(1000), y(1000);
    auto plan = comm.plan_allreduce(BufferView(span<double>(x)), BufferView(span<double>(y)),
                                    ReduceOp::avg);
    CHECK(plan.algorithm() != AllreduceAlgorithm::automatic);
    for (int step = 0; step < 5; ++step) {
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = step + t.rank() * 3.0 + static_cast<double>(i);
      if (step % 2) {
        plan.execute();
      } else {
        auto h = plan.start();
        h.wait();
      }
      CHECK(y[10] == doctest::Approx(step + 3.0 + 10));
    }
    CHECK(comm.sequence() >= 5);
  });
}

TEST_CASE("cost model: measured once, agreed by all ranks, picks by size") {
  std::mutex m;
  std::vector<CostModel> models;
  std::vector<AllreduceAlgorithm> small, large;
  run_loopback(4, [&](LoopbackTransport& t) {
    CommConfig c = quick();
    c.default_algorithm = AllreduceAlgorithm::automatic;
    Communicator comm(t, c);
    const CostModel cm = comm.cost_model();
    const auto s = comm.select_allreduce(16, DType::f32);
    const auto l = comm.select_allreduce(64u << 20, DType::f32);
    std::lock_guard<std::mutex> lock(m);
    models.push_back(cm);
    small.push_back(s);
    large.push_back(l);
  });
  REQUIRE(models.size() == 4);
  for (const auto& cm : models) {
    CHECK(cm.valid());
    CHECK(cm.alpha == models[0].alpha);
    CHECK(cm.beta == models[0].beta);
    CHECK(cm.gamma == models[0].gamma);
  }
  for (int r = 1; r < 4; ++r) CHECK(small[r] == small[0]);
  // The model itself: latency-bound sizes go to recursive doubling, bandwidth-bound ones to an
  // algorithm that moves 2(p-1)/p of the vector.
  CostModel cm{5e-6, 1.0 / 10e9, 1.0 / 20e9};
  CHECK(cm.best(64, 8) == AllreduceAlgorithm::rd);
  CHECK(cm.best(64u << 20, 8) == AllreduceAlgorithm::rhd);   // same bytes as ring, fewer steps
  CHECK(cm.best(64u << 20, 6) == AllreduceAlgorithm::ring);  // rhd would pay the fold
  CHECK(cm.best(64u << 20, 2) == AllreduceAlgorithm::ring);
  CHECK(cm.predict(AllreduceAlgorithm::rhd, 1 << 20, 6) >
        cm.predict(AllreduceAlgorithm::rhd, 1 << 20, 4));
  CHECK(cm.best(64u << 20, 64) != AllreduceAlgorithm::rd);
}

TEST_CASE("DTRAIN_ALLREDUCE_ALGO overrides automatic; an argument overrides both") {
  ::setenv("DTRAIN_ALLREDUCE_ALGO", "tree", 1);
  CommConfig c = CommConfig::from_env();
  ::unsetenv("DTRAIN_ALLREDUCE_ALGO");
  CHECK(c.default_algorithm == AllreduceAlgorithm::tree);
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t, c);
    std::vector<float> x(100, 1.0f);
    CHECK(comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)), ReduceOp::sum)
              .algorithm() == AllreduceAlgorithm::tree);
    CHECK(comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)), ReduceOp::sum,
                              AllreduceAlgorithm::rhd)
              .algorithm() == AllreduceAlgorithm::rhd);
  });
  ::setenv("DTRAIN_ALLREDUCE_ALGO", "bogus", 1);
  CHECK_THROWS_AS(CommConfig::from_env(), InvalidArgument);
  ::unsetenv("DTRAIN_ALLREDUCE_ALGO");
}

TEST_CASE("double binary tree: two spanning trees, interior nodes mostly disjoint") {
  for (int p = 1; p <= 70; ++p) {
    CAPTURE(p);
    for (int k = 0; k < 2; ++k) {
      int roots = 0;
      std::vector<int> kids_seen(p, 0);
      int max_depth = 0;
      for (int r = 0; r < p; ++r) {
        const auto l = detail::tree_links(k, r, p);
        if (l.parent < 0) ++roots;
        for (int c = 0; c < l.nchildren; ++c) {
          ++kids_seen[l.children[c]];
          CHECK(detail::tree_links(k, l.children[c], p).parent == r);
        }
        int d = 0;
        for (int x = r; detail::tree_links(k, x, p).parent >= 0 && d <= p;
             x = detail::tree_links(k, x, p).parent)
          ++d;
        max_depth = std::max(max_depth, d);
      }
      CHECK(roots == 1);
      for (int r = 0; r < p; ++r)
        CHECK(kids_seen[r] == (detail::tree_links(k, r, p).parent >= 0 ? 1 : 0));
      int lg = 0;
      while ((1 << lg) < p) ++lg;
      CHECK(max_depth <= lg + 1);
    }
    if (p % 2 == 0) {
      for (int r = 0; r < p; ++r) {
        const bool interior0 = detail::tree_links(0, r, p).nchildren > 0;
        const bool interior1 = detail::tree_links(1, r, p).nchildren > 0;
        CHECK_FALSE((interior0 && interior1));
      }
    }
  }
}

TEST_CASE("shm needs shared segments: DTRAIN_SHM=0 turns them off, no silent fallback") {
  ::setenv("DTRAIN_SHM", "0", 1);
  run_loopback(2, [&](LoopbackTransport& t) {
    CHECK(t.shared_segments() == nullptr);
    Communicator comm(t, quick());
    std::vector<float> x(10, 1.0f);
    CHECK_THROWS_WITH_AS(
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::shm),
        doctest::Contains("shm needs a transport with node-shared segments"), InvalidArgument);
    CostModel cm{1e-6, 1e-10, 1e-11};
    CHECK(cm.best(1 << 20, 2) != AllreduceAlgorithm::shm);  // shm_alpha 0: not available
    comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum);
    CHECK(x[0] == 2.0f);
  });
  ::unsetenv("DTRAIN_SHM");
  run_loopback(2, [&](LoopbackTransport& t) { CHECK(t.shared_segments() != nullptr); });
}

TEST_CASE("AnyTransport: runtime choice behind one communicator type") {
  static_assert(is_transport_v<AnyTransport>, "");
  run_loopback(3, [&](LoopbackTransport& lt) {
    AnyTransport t(lt);
    CHECK(t.rank() == lt.rank());
    CHECK(t.shared_segments() == lt.shared_segments());
    Communicator<AnyTransport> comm(t, quick());
    for (auto algo : {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
                      AllreduceAlgorithm::rd, AllreduceAlgorithm::shm}) {
      std::vector<std::int64_t> x(1001, t.rank() + 1);
      comm.allreduce(BufferView(span<std::int64_t>(x)), ReduceOp::sum, algo);
      CHECK(x[1000] == 6);
    }
    std::vector<float> y(10, 1.0f);
    auto h = comm.iallreduce(BufferView(span<float>(y)), ReduceOp::max);
    h.wait();
    CHECK(y[0] == 1.0f);
  });
}

}  // namespace dtrain_test_comm_safety_test
