// An `automatic` all-reduce plan that checks its algorithm while in use (detail/adaptive.hpp):
// the window schedule on its own, then plans on loopback ranks whose timings a hook replaces, so
// that which algorithm is faster is decided by the test.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_adaptive_test {

using namespace dtrain;
using detail::AdaptSample;
using detail::AdaptSchedule;

namespace {

// A given model: no calibration runs, the decision table follows from it alone.
CommConfig config() {
  CommConfig c;
  c.timeout_s = 60;
  c.default_algorithm = AllreduceAlgorithm::automatic;
  c.adaptive = true;
  c.cost_model.alpha = 2e-6;
  c.cost_model.beta = 1.0 / 4e9;
  c.cost_model.gamma = 1.0 / 8e9;
  return c;
}

struct Hook {
  explicit Hook(std::function<double(const AdaptSample&)> f) {
    detail::adapt_hook() = std::move(f);
  }
  ~Hook() { detail::adapt_hook() = nullptr; }
};

// Drives a schedule with fixed times per algorithm (index 0 = the plan's first algorithm);
// returns the executions that ran the second one.
std::vector<std::uint64_t> drive(AdaptSchedule& s, std::uint64_t n, double t0, double t1) {
  std::vector<std::uint64_t> second;
  for (std::uint64_t i = 0; i < n; ++i) {
    const bool runs_second = s.next_is_runner_up() != s.swapped();
    if (runs_second) second.push_back(s.executions());
    if (s.record(runs_second ? t1 : t0)) s.decide();  // one rank: its times are the agreed ones
  }
  return second;
}

// Element i of rank r's input: small integers, so every algorithm's sum is exact.
float input(int r, std::size_t i, int step) {
  return static_cast<float>(r * 10 + static_cast<int>(i % 7) + step % 5);
}
float expected(int p, std::size_t i, int step) {
  float s = 0;
  for (int r = 0; r < p; ++r) s += input(r, i, step);
  return s;
}

}  // namespace

TEST_CASE("adaptive schedule: windows at fixed executions, the gap doubling while kept") {
  AdaptSchedule s;
  // 4 executions of the algorithm in use, then a window of 10: the runner-up at 4-8 (4 untimed),
  // the algorithm in use at 9-13 (9 untimed).
  const std::vector<std::uint64_t> second = drive(s, 14, 1.0, 2.0);
  CHECK(second == std::vector<std::uint64_t>{4, 5, 6, 7, 8});
  CHECK(s.windows() == 1);
  CHECK(s.switches() == 0);
  CHECK(s.last_vote() == std::array<double, 2>{1.0, 2.0});
  // Next window 16 executions after the first closed (at 14), the blocks the other way round:
  // 30-34 in use, 35-39 runner-up; then 32 after: 72-81, the runner-up first again.
  const std::vector<std::uint64_t> more = drive(s, 26, 1.0, 2.0);  // executions 14..39
  CHECK(more == std::vector<std::uint64_t>{35, 36, 37, 38, 39});
  const std::vector<std::uint64_t> third = drive(s, 50, 1.0, 2.0);  // 40..89
  CHECK(third == std::vector<std::uint64_t>{72, 73, 74, 75, 76});
  // The gap stops doubling at kAdaptMaxGap: a long run checks about once per 1024 executions.
  AdaptSchedule l;
  const std::vector<std::uint64_t> all = drive(l, 200000, 1.0, 2.0);
  CHECK(l.switches() == 0);
  const int windows = l.windows();
  CHECK(windows > 190);
  CHECK(windows < 200);
  CHECK(all.size() == static_cast<std::size_t>((detail::kAdaptBlock + 1) * windows));
}

TEST_CASE("adaptive schedule: the runner-up takes over after two windows beyond the margin") {
  AdaptSchedule s;
  drive(s, 200, 1.0, 1.0 / detail::kAdaptSwitchFactor * 1.01);  // a near tie: kept
  CHECK_FALSE(s.swapped());
  CHECK(s.windows() > 3);
  AdaptSchedule w;
  drive(w, 14, 1.0, 0.5);  // twice as fast: favoured by the first window, not yet taken
  CHECK_FALSE(w.swapped());
  CHECK(w.windows() == 1);
  CHECK(w.last_vote() == std::array<double, 2>{1.0, 0.5});
  // The confirming window follows 8 executions on (22-31, the runner-up second), and the
  // runner-up takes over.
  CHECK(drive(w, 18, 1.0, 0.5) == std::vector<std::uint64_t>{27, 28, 29, 30, 31});
  CHECK(w.swapped());
  CHECK(w.switches() == 1);
  // From now on the second algorithm is the one in use: the next window (16 executions on, at
  // 48-57) times the first one as the runner-up; it is still slower, so nothing changes.
  const std::vector<std::uint64_t> second = drive(w, 26, 1.0, 0.5);  // 32..57
  CHECK(w.switches() == 1);
  CHECK(w.windows() == 3);
  CHECK(second.size() == 26 - 5);  // all but the first algorithm's block at 48-52
  // The first algorithm becomes the faster one: the plan goes back after two windows.
  drive(w, 200, 0.2, 0.5);
  CHECK_FALSE(w.swapped());
  CHECK(w.switches() == 2);
}

TEST_CASE("adaptive schedule: one disturbed window, or execution, does not decide") {
  // A burst that made the runner-up look fast in one window only: the confirming window finds
  // it slower again and the choice stands.
  AdaptSchedule s;
  for (std::uint64_t i = 0; i < 60; ++i) {
    const bool runner = s.next_is_runner_up();
    const double t = runner ? (i < 14 ? 0.5 : 2.0) : 1.0;
    if (s.record(t)) s.decide();
  }
  CHECK(s.windows() == 3);  // 4-13 favoured it, 22-31 did not, 48-57 did not
  CHECK(s.switches() == 0);
  // One execution of each window hit by a burst: the median ignores it.
  AdaptSchedule m;
  for (std::uint64_t i = 0; i < 32; ++i) {
    const bool runner = m.next_is_runner_up();
    double t = runner ? 0.5 : 1.0;
    if (runner && m.timing() && (i == 6 || i == 29)) t = 50;
    if (m.record(t)) m.decide();
  }
  CHECK(m.swapped());
}

TEST_CASE("adaptive plan: every rank changes to the faster runner-up together, and back") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    const std::size_t n = 3000;
    std::vector<AllreduceAlgorithm> first(p), runner(p), after(p), back(p);
    std::vector<int> changes(p), checks(p);
    std::atomic<long> wrong{0};
    std::mutex m;
    std::vector<std::vector<std::pair<std::uint64_t, AllreduceAlgorithm>>> ran(p);
    // Which algorithm is fast is read from `fast` by every rank's thread.
    std::atomic<int> fast{-1};
    Hook h([&](const AdaptSample& s) {
      {
        std::lock_guard<std::mutex> lock(m);
        ran[static_cast<std::size_t>(s.rank)].emplace_back(s.execution, s.algo);
      }
      return static_cast<int>(s.algo) == fast.load() ? 1e-4 : 3e-4;
    });
    run_loopback(p, [&](LoopbackTransport& t) {
      const int r = t.rank();
      const auto i = static_cast<std::size_t>(r);
      Communicator comm(t, config());
      std::vector<float> x(n);
      auto plan = comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)),
                                      ReduceOp::sum);
      first[i] = plan.algorithm();
      runner[i] = plan.runner_up();
      if (r == 0) fast = static_cast<int>(plan.runner_up());
      comm.barrier();
      auto step = [&](int k) {
        for (std::size_t e = 0; e < n; ++e) x[e] = input(r, e, k);
        plan.execute();
        for (std::size_t e = 0; e < n; ++e)
          if (x[e] != expected(p, e, k)) ++wrong;
      };
      int k = 0;
      for (; k < 40; ++k) step(k);  // the windows at 4-13 and 22-31 change
      after[i] = plan.algorithm();
      comm.barrier();
      if (r == 0) fast = static_cast<int>(first[0]);
      comm.barrier();
      for (; k < 80; ++k) step(k);  // 48-57 and 66-75 change back
      back[i] = plan.algorithm();
      changes[i] = plan.algorithm_changes();
      checks[i] = plan.algorithm_checks();
    });
    CHECK(wrong == 0);
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const auto i = static_cast<std::size_t>(r);
      CHECK(first[i] == first[0]);
      CHECK(runner[i] == runner[0]);
      CHECK(runner[i] != first[i]);
      CHECK(runner[i] != AllreduceAlgorithm::automatic);
      CHECK(after[i] == runner[0]);
      CHECK(back[i] == first[0]);
      CHECK(changes[i] == 2);
      CHECK(checks[i] == 4);
      CHECK(ran[i] == ran[0]);  // the same algorithm at every timed execution on every rank
    }
    CHECK(ran[0].size() == 4 * 2 * detail::kAdaptBlock);
  }
}

TEST_CASE("adaptive plan: ranks that disagree follow the agreed (slowest) medians") {
  // Rank 0 sees the runner-up twice as fast, rank 1 twice as slow: the agreed medians are the
  // maximum over ranks, so the runner-up (slower on rank 1) is not taken, on either rank.
  const int p = 2;
  std::vector<AllreduceAlgorithm> first(p), after(p);
  std::vector<int> checks(p);
  std::atomic<long> wrong{0};
  std::atomic<int> runner_up{-1};
  Hook h([&](const AdaptSample& s) {
    const bool is_runner = static_cast<int>(s.algo) == runner_up.load();
    if (!is_runner) return 1e-4;
    return s.rank == 0 ? 0.5e-4 : 2e-4;
  });
  run_loopback(p, [&](LoopbackTransport& t) {
    const int r = t.rank();
    Communicator comm(t, config());
    std::vector<float> x(1000);
    auto plan =
        comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)), ReduceOp::sum);
    if (r == 0) runner_up = static_cast<int>(plan.runner_up());
    comm.barrier();
    first[static_cast<std::size_t>(r)] = plan.algorithm();
    for (int k = 0; k < 40; ++k) {
      for (std::size_t e = 0; e < x.size(); ++e) x[e] = input(r, e, k);
      plan.execute();
      for (std::size_t e = 0; e < x.size(); ++e)
        if (x[e] != expected(p, e, k)) ++wrong;
    }
    after[static_cast<std::size_t>(r)] = plan.algorithm();
    checks[static_cast<std::size_t>(r)] = plan.algorithm_checks();
  });
  CHECK(wrong == 0);
  CHECK(after[0] == first[0]);
  CHECK(after[1] == first[1]);
  CHECK(checks[0] == 2);
  CHECK(checks[1] == 2);
}

TEST_CASE("adaptive plan: started on the progress thread, in a gradient sync") {
  // The buckets of a GradientSync are adaptive plans run by wait() or the progress thread: the
  // average stays exact while the plans change algorithm.
  const int p = 2;
  std::atomic<long> wrong{0};
  std::vector<int> changes(p);
  std::atomic<int> slow{-1};
  Hook h(
      [&](const AdaptSample& s) { return static_cast<int>(s.algo) == slow.load() ? 3e-4 : 1e-4; });
  run_loopback(p, [&](LoopbackTransport& t) {
    const int r = t.rank();
    CommConfig c = config();
    c.progress = CommProgress::thread;
    Communicator comm(t, c);
    // The algorithm `automatic` gives the buckets is made the slow one: they all change.
    if (r == 0) slow = static_cast<int>(comm.select_allreduce(256, DType::f32));
    comm.barrier();
    std::vector<float> g(1024);
    GradientSync sync(comm, BufferView(span<float>(g)), 256 * sizeof(float));
    for (int k = 0; k < 40; ++k) {
      for (std::size_t e = 0; e < g.size(); ++e) g[e] = input(r, e, k);
      sync.sync_all();
      for (std::size_t e = 0; e < g.size(); ++e)
        if (g[e] != expected(p, e, k) / p) ++wrong;
    }
    CHECK(sync.bucket_count() == 4);
    for (std::size_t b = 0; b < sync.bucket_count(); ++b) {
      changes[static_cast<std::size_t>(r)] += sync.bucket_algorithm_changes(b);
      CHECK(static_cast<int>(sync.bucket_algorithm(b)) != slow.load());
    }
  });
  CHECK(wrong == 0);
  CHECK(changes[0] == 4);  // each bucket once
  CHECK(changes[1] == 4);
}

TEST_CASE("adaptive plan: off where the choice must repeat, or was not automatic's") {
  struct Case {
    const char* name;
    std::function<void(CommConfig&)> set;
    AllreduceAlgorithm arg;
  };
  const std::string tuning = "/tmp/dtrain_adapt_tuning_" + std::to_string(::getpid()) + ".txt";
  const Case cases[] = {
      {"adaptive off (the default)", [](CommConfig& c) { c = CommConfig{}; },
       AllreduceAlgorithm::automatic},
      {"reproducible", [](CommConfig& c) { c.reproducible = true; }, AllreduceAlgorithm::automatic},
      {"tuning file", [&](CommConfig& c) { c.tuning_file = tuning; },
       AllreduceAlgorithm::automatic},
      {"pinned by configuration",
       [](CommConfig& c) { c.default_algorithm = AllreduceAlgorithm::ring; },
       AllreduceAlgorithm::automatic},
      // Adaptive otherwise: the ad-hoc `automatic` calls below must still keep their algorithm.
      {"pinned by argument", [](CommConfig&) {}, AllreduceAlgorithm::rhd},
  };
  std::atomic<int> samples{0};
  Hook h([&](const AdaptSample&) {
    ++samples;
    return 1e-4;
  });
  for (const Case& cs : cases) {
    CAPTURE(cs.name);
    std::vector<int> checks(2, -1);
    std::vector<AllreduceAlgorithm> runner(2);
    run_loopback(2, [&](LoopbackTransport& t) {
      CommConfig c = config();
      cs.set(c);
      Communicator comm(t, c);
      std::vector<float> x(100, 1.0f);
      auto plan = comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)),
                                      ReduceOp::max, cs.arg);
      for (int k = 0; k < 20; ++k) plan.execute();
      for (int k = 0; k < 20; ++k) comm.allreduce(BufferView(span<float>(x)), ReduceOp::max);
      checks[static_cast<std::size_t>(t.rank())] = plan.algorithm_checks();
      runner[static_cast<std::size_t>(t.rank())] = plan.runner_up();
    });
    CHECK(checks[0] == 0);
    CHECK(checks[1] == 0);
    CHECK(runner[0] == AllreduceAlgorithm::automatic);
    CHECK(samples == 0);
  }
  std::remove(tuning.c_str());
}

}  // namespace dtrain_test_comm_adaptive_test
