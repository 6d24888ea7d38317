// ParameterSet with GradientSync over loopback ranks: a hand-written backward that reports each
// tensor as it finishes gets every gradient averaged across the ranks (equal to an independent
// average), buckets start before the backward ends, and the replicas stay identical through
// AdamW steps with clipping.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/parameter_set.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/train/replica_check.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_own_model_sync_test {

using namespace dtrain;

namespace {
// Four tensors of uneven sizes (3000 + 7 + 2048 + 1 elements).
std::vector<ParameterSpec> specs() {
  return {{"a/weight", {100, 30}, ParameterInit::kaiming_uniform},
          {"a/bias", {7}},
          {"b/weight", {64, 32}, ParameterInit::xavier_uniform},
          {"b/bias", {1}}};
}
// The "gradient" rank r computes for element k of step s: multiples of 1/4, so that sums over
// the ranks are exact in float and an average over a power-of-two rank count is too.
float grad_of(int rank, int step, std::size_t k) {
  return static_cast<float>((rank + 1) * (step + 2) + static_cast<int>(k % 13)) * 0.25f;
}
}  // namespace

TEST_CASE("own_model: GradientSync averages a set's gradients reported tensor by tensor") {
  for (int p : {1, 2, 3, 4}) {
    CAPTURE(p);
    std::atomic<int> bad{0}, early{0};
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c;
      c.timeout_s = 30;
      c.progress = CommProgress::thread;
      Communicator comm(t, c);
      ParameterSet set(specs());
      set.init(5);
      // 1024-float buckets: the last tensor alone does not fill one, the first spans three.
      BasicGradientSync<HostExec> sync(set.exec(), comm, set.gradients(), 4096);
      for (int step = 0; step < 3; ++step) {
        set.zero_grad();
        // Backward by hand, last tensor first; each tensor is reported when it is written.
        for (std::size_t i = set.size(); i-- > 0;) {
          const auto r = set.tensor(i);
          for (std::size_t k = 0; k < r.count; ++k)
            r.grad[k] += grad_of(t.rank(), step, r.offset + k);
          set.grad_ready(i, sync);
          if (i == 2 && sync.buckets_started() >= 2) ++early;  // before the backward ends
        }
        sync.wait();
        const auto g = set.gradient_span();
        for (std::size_t k = 0; k < g.size(); ++k) {
          double sum = 0;
          for (int q = 0; q < p; ++q) sum += grad_of(q, step, k);
          const double ref = sum / p;
          const bool exact = (p & (p - 1)) == 0;
          if (exact ? g[k] != static_cast<float>(ref)
                    : std::fabs(g[k] - ref) > 1e-6 * std::fabs(ref))
            ++bad;
        }
      }
      // Training steps keep the replicas bit-identical.
      AdamW opt(set, 1e-2);
      for (int step = 0; step < 3; ++step) {
        set.zero_grad();
        for (std::size_t i = set.size(); i-- > 0;) {
          const auto r = set.tensor(i);
          for (std::size_t k = 0; k < r.count; ++k)
            r.grad[k] = r.param[k] * static_cast<float>(t.rank() + 1);
          set.grad_ready(r.index, sync);
        }
        sync.wait();
        clip_grad_norm(set.gradients(), 1.0);
        opt.step();
      }
      if (!replicas_identical(comm, set)) ++bad;
    });
    CHECK(bad.load() == 0);
    CHECK(early.load() == 3 * p);
  }
}

TEST_CASE("own_model: sharded steps on a set's arenas follow the replicated steps") {
  // Each rank updates only its part of the set's parameters (reduce-scatter, sharded AdamW,
  // all-gather): within rounding of the same steps taken replicated, identical on every rank.
  for (int p : {2, 3, 4}) {
    CAPTURE(p);
    std::atomic<int> bad{0};
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c;
      c.timeout_s = 30;
      Communicator comm(t, c);
      ParameterSet replicated(specs()), sharded(specs());
      replicated.init(5);
      sharded.init(5);
      BasicGradientSync<HostExec> sync_r(replicated.exec(), comm, replicated.gradients(), 4096);
      BasicGradientSync<HostExec> sync_s(sharded.exec(), comm, sharded.gradients(), 4096);
      AdamW opt_r(replicated, 1e-2), opt_s(sharded, 1e-2);
      sync_s.shard_updates(sharded.parameters(), opt_s);
      for (int step = 0; step < 3; ++step) {
        for (ParameterSet* set : {&replicated, &sharded}) {
          set->zero_grad();
          for (std::size_t i = set->size(); i-- > 0;) {
            const auto r = set->tensor(i);
            for (std::size_t k = 0; k < r.count; ++k)
              r.grad[k] = r.param[k] * static_cast<float>(t.rank() + 1) +
                          grad_of(t.rank(), step, r.offset + k) * 1e-3f;
            set->grad_ready(i, set == &sharded ? sync_s : sync_r);
          }
        }
        sync_r.wait();
        opt_r.step();
        sync_s.wait(opt_s);
      }
      if (!sync_s.sharded() || !opt_s.state_partial()) ++bad;  // each rank held a part only
      const auto a = replicated.parameter_span(), b = sharded.parameter_span();
      for (std::size_t k = 0; k < a.size(); ++k)
        if (std::fabs(a[k] - b[k]) > 1e-6f * std::max(1.0f, std::fabs(a[k]))) ++bad;
      if (!replicas_identical(comm, sharded)) ++bad;
    });
    CHECK(bad.load() == 0);
  }
}

}  // namespace dtrain_test_own_model_sync_test
