// Executing a plan allocates nothing: counted with a replaced global operator new on the
// executing thread.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

// The replacement pairs malloc with free on purpose.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
thread_local long g_allocations = 0;
}

void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace dtrain;

TEST_CASE("plan execution does not allocate") {
  for (auto algo : {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
                    AllreduceAlgorithm::rd, AllreduceAlgorithm::shm}) {
    CAPTURE(name_of(algo));
    std::vector<long> counts(3, -1);
    run_loopback(3, [&](LoopbackTransport& t) {
      CommConfig c;
      c.segment_bytes = 512;
      c.timeout_s = 30;
      Communicator comm(t, c);
      std::vector<float> x(5000, 1.0f);
      std::vector<std::uint16_t> h(333, 0x3c00);  // f16 ones: the widening path
      auto plan = comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)),
                                      ReduceOp::sum, algo);
      auto plan16 =
          comm.plan_allreduce(BufferView(h.data(), h.size(), DType::f16),
                              BufferView(h.data(), h.size(), DType::f16), ReduceOp::avg, algo);
      auto bcast = comm.plan_broadcast(BufferView(span<float>(x)), 1);
      plan.execute();  // first execution may touch lazily created state
      const long before = g_allocations;
      for (int i = 0; i < 5; ++i) {
        plan.execute();
        plan16.execute();
        bcast.execute();
      }
      counts[t.rank()] = g_allocations - before;
    });
    for (long c : counts) CHECK(c == 0);
  }
}

TEST_CASE("an adaptive plan's windows, votes and change of algorithm do not allocate") {
  // `automatic` with a given model: the plan times its runner-up now and then and agrees on the
  // timings; the hook makes the runner-up faster, so the plan changes algorithm after its
  // windows at 4-13 and 22-31, and checks the change at 48-57.
  std::atomic<int> slow{-1};
  detail::adapt_hook() = [&](const detail::AdaptSample& s) {
    return static_cast<int>(s.algo) == slow.load() ? 1e-4 : 1e-5;
  };
  std::vector<long> counts(3, -1);
  std::vector<int> checks(3, 0), changes(3, 0);
  run_loopback(3, [&](LoopbackTransport& t) {
    CommConfig c;
    c.segment_bytes = 512;
    c.timeout_s = 30;
    c.adaptive = true;
    c.cost_model.alpha = 2e-6;
    c.cost_model.beta = 1.0 / 4e9;
    c.cost_model.gamma = 1.0 / 8e9;
    Communicator comm(t, c);
    std::vector<float> x(5000, 1.0f);
    auto plan =
        comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)), ReduceOp::max);
    if (t.rank() == 0) slow = static_cast<int>(plan.algorithm());
    comm.barrier();
    // Both algorithms' first executions (the runner-up's at 4) may touch lazily created state.
    for (int i = 0; i < 10; ++i) plan.execute();
    const long before = g_allocations;
    for (int i = 0; i < 50; ++i) plan.execute();
    counts[t.rank()] = g_allocations - before;
    checks[t.rank()] = plan.algorithm_checks();
    changes[t.rank()] = plan.algorithm_changes();
  });
  detail::adapt_hook() = nullptr;
  for (long c : counts) CHECK(c == 0);
  for (int k : checks) CHECK(k == 3);
  for (int k : changes) CHECK(k == 1);
}
