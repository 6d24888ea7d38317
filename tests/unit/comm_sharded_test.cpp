// GradientSync's sharded steps (shard_updates): each bucket reduce-scattered, each rank updating
// its part, the parameters all-gathered. Against the unsharded step (the all-reduce, every rank
// updating everything) on the same gradients, with SGD (momentum, weight decay) and AdamW:
// - 1 and 2 ranks: the same parameter bits after several steps, and after gather_state the same
//   optimizer state bits; with the arenas in the node-shared heaps (one hand-off per collective,
//   counted) and in private memory (the ring);
// - 3 and 4 ranks: the same bits in reproducible mode (rank-order sums in both), within rounding
//   otherwise;
// - the state sharded with the updates (shard_updates(params, optimizer)): the same bits, held
//   in parts from before the first step;
// - the state is partial between a sharded step and gather_state: saving refuses it, loading
//   into it keeps this rank's parts; wait() without the optimizer and a misshapen parameter
//   arena are errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/optim/adamw.hpp>
#include <dtrain/optim/sgd.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_sharded_test {

using namespace dtrain;

namespace {

SharedSegmentConfig heap_config() {
  SharedSegmentConfig c;
  c.slot_bytes = 64 * 1024;
  c.slots = 4;
  c.heap_bytes = 8 << 20;
  return c;
}

// Deterministic values whose sums round (any other order of a reduction changes bits).
float noise(std::uint64_t seed, std::size_t i) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
  s ^= s >> 31, s *= 0x94D049BB133111EBull, s ^= s >> 29;
  return static_cast<float>(static_cast<double>(s % 2000003) / 1000001.0 - 1.0);
}

struct Result {
  std::vector<float> params, state;
  std::uint64_t part_calls = 0;
  bool partial_after_step = false, partial_after_gather = true;
  // Elements per state arena in memory before the first step, after the steps and after
  // gather_state.
  std::size_t state_elements_before_step = 0, state_elements_after_step = 0,
              state_elements_after_gather = 0;
};

// `steps` steps of `opt_name` on n parameters over p ranks, sharded or not, arenas from the heap
// or private memory; rank r's gradients at each step are noise(r, step). Returns each rank's
// parameters and (gathered) optimizer state. `at_once`: the optimizer's state is sharded with
// the updates (shard_updates(params, optimizer)), not at the first sharded step.
std::vector<Result> train(int p, bool sharded, bool heap, bool reproducible,
                          const std::string& opt_name, std::size_t n, int steps,
                          bool at_once = false) {
  LoopbackWorld world(p, heap_config());
  std::vector<Result> out(static_cast<std::size_t>(p));
  run_loopback(world, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    c.reproducible = reproducible;
    Communicator comm(t, c);
    const int r = t.rank();
    Allocator& a = heap ? comm.shared_allocator() : default_allocator();
    auto* params = static_cast<float*>(a.allocate(n * sizeof(float), 64));
    auto* grads = static_cast<float*>(a.allocate(n * sizeof(float), 64));
    for (std::size_t i = 0; i < n; ++i) params[i] = noise(99, i);  // the same on every rank
    const BufferView pv(params, n, DType::f32), gv(grads, n, DType::f32);
    // 5 buckets of 1000 floats and a last one of n - 5000, parts of uneven sizes.
    GradientSync sync(comm, gv, 4000, AllreduceAlgorithm::ring);
    if (sharded && !at_once) sync.shard_updates(pv);
    SgdOptions so;
    so.momentum = 0.9;
    so.weight_decay = 1e-3;
    // The optimizer state beside the arenas (from the heap there: its gather reads in place).
    Sgd sgd(pv, gv, Schedule::constant(0.05), so, a);
    AdamW adamw(pv, gv, Schedule::constant(0.01), AdamWOptions{}, a);
    if (sharded && at_once) {
      if (opt_name == "sgd")
        sync.shard_updates(pv, sgd);
      else
        sync.shard_updates(pv, adamw);
    }
    Result& res0 = out[static_cast<std::size_t>(r)];
    res0.state_elements_before_step =
        opt_name == "sgd" ? sgd.state_elements() : adamw.state_elements();
    const SharedSegments* seg = node_segments_of(t);
    const std::uint64_t before = seg ? seg->part_calls : 0;
    Result& res = out[static_cast<std::size_t>(r)];
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i = 0; i < n; ++i)
        grads[i] = noise(static_cast<std::uint64_t>(r * 1000 + step), i);
      // "Backward" in two halves, the end of the arena first.
      sync.ready(n / 2, n - n / 2);
      sync.ready(0, n / 2);
      if (opt_name == "sgd")
        sync.wait(sgd);
      else
        sync.wait(adamw);
    }
    res.partial_after_step = opt_name == "sgd" ? sgd.state_partial() : adamw.state_partial();
    res.state_elements_after_step =
        opt_name == "sgd" ? sgd.state_elements() : adamw.state_elements();
    if (opt_name == "sgd")
      sync.gather_state(sgd);
    else
      sync.gather_state(adamw);
    res.partial_after_gather = opt_name == "sgd" ? sgd.state_partial() : adamw.state_partial();
    res.state_elements_after_gather =
        opt_name == "sgd" ? sgd.state_elements() : adamw.state_elements();
    res.params.assign(params, params + n);
    auto keep = [&](BufferView s) {
      const auto* f = static_cast<const float*>(s.data);
      res.state.insert(res.state.end(), f, f + s.count);
    };
    if (opt_name == "sgd")
      sgd.for_each_state_arena(keep);
    else
      adamw.for_each_state_arena(keep);
    res.part_calls = (seg ? seg->part_calls : 0) - before;
    a.deallocate(grads, n * sizeof(float));
    a.deallocate(params, n * sizeof(float));
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// While sharded each rank keeps the state of its parts only: together exactly the arena (the
// parts partition every bucket), each rank at most 1/p of each of the 6 buckets rounded up;
// whole-sized again once gathered, and always without sharding.
void check_state_memory(const std::vector<Result>& sharded, const std::vector<Result>& plain,
                        std::size_t n) {
  std::size_t total = 0;
  for (std::size_t r = 0; r < sharded.size(); ++r) {
    CAPTURE(r);
    const std::size_t kept = sharded[r].state_elements_after_step;
    total += kept;
    if (sharded.size() > 1) CHECK(kept <= n / sharded.size() + 6);
    CHECK(sharded[r].state_elements_after_gather == n);
    CHECK(plain[r].state_elements_after_step == n);
  }
  CHECK(total == n);
}

std::size_t far_apart(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  std::size_t far = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    far += std::fabs(a[i] - b[i]) > tol * (1 + std::fabs(b[i]));
  return far;
}

}  // namespace

TEST_CASE(
    "sharded steps on 1 and 2 ranks: the unsharded step's parameters and state, bit for bit") {
  const std::size_t n = 5777;
  for (int p : {1, 2})
    for (const std::string opt : {"sgd", "adamw"})
      for (const bool heap : {true, false}) {
        CAPTURE(p);
        CAPTURE(opt);
        CAPTURE(heap);
        const auto plain = train(p, false, heap, false, opt, n, 4);
        const auto sharded = train(p, true, heap, false, opt, n, 4);
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          const Result& s = sharded[static_cast<std::size_t>(r)];
          CHECK(same_bits(s.params, plain[0].params));
          CHECK(same_bits(s.state, plain[0].state));
          CHECK(same_bits(plain[static_cast<std::size_t>(r)].params, plain[0].params));
          CHECK(s.partial_after_step == (p > 1));  // one rank: nothing to shard
          CHECK_FALSE(s.partial_after_gather);
          CHECK_FALSE(plain[static_cast<std::size_t>(r)].partial_after_step);
          // 6 buckets x 4 steps, a reduce-scatter and an all-gather each; the state's gather
          // (momentum: 6 all-gathers; AdamW: 12) too, all from the heaps where the arenas are
          // (one rank: nothing to exchange).
          const std::uint64_t want = heap && p > 1 ? 48u + (opt == "sgd" ? 6u : 12u) : 0u;
          CHECK(s.part_calls == want);
        }
        // Training moved the parameters: the comparison is not between two untouched arenas.
        CHECK(plain[0].params[17] != noise(99, 17));
        check_state_memory(sharded, plain, n);
        // The state sharded with the updates: the same bits, held in parts from the start.
        const auto at_once = train(p, true, heap, false, opt, n, 4, true);
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          const Result& s = at_once[static_cast<std::size_t>(r)];
          CHECK(same_bits(s.params, plain[0].params));
          CHECK(same_bits(s.state, plain[0].state));
          CHECK(s.state_elements_before_step == s.state_elements_after_step);
          CHECK(sharded[static_cast<std::size_t>(r)].state_elements_before_step == n);
        }
        check_state_memory(at_once, plain, n);
      }
}

TEST_CASE("sharded steps on 3 and 4 ranks: reproducible bits, else within rounding") {
  const std::size_t n = 5777;
  for (int p : {3, 4})
    for (const std::string opt : {"sgd", "adamw"}) {
      CAPTURE(p);
      CAPTURE(opt);
      const auto plain_rep = train(p, false, true, true, opt, n, 3);
      const auto sharded_rep = train(p, true, true, true, opt, n, 3);
      const auto plain = train(p, false, true, false, opt, n, 3);
      const auto sharded = train(p, true, true, false, opt, n, 3);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const auto i = static_cast<std::size_t>(r);
        CHECK(same_bits(sharded_rep[i].params, plain_rep[0].params));
        CHECK(same_bits(sharded_rep[i].state, plain_rep[0].state));
        // Every rank ends with the same parameters, whoever updated them.
        CHECK(same_bits(sharded[i].params, sharded[0].params));
        CHECK(far_apart(sharded[i].params, plain[0].params, 1e-5) == 0u);
      }
      check_state_memory(sharded, plain, n);
    }
}

namespace {
// A checkpoint visitor that accepts anything and says whether it loads.
struct Visitor {
  bool load = false;
  int tensors = 0;
  bool loading() const { return load; }
  template <class... A>
  void tensor(A&&...) {
    ++tensors;
  }
  template <class... A>
  void scalar(A&&...) {}
};
// An optimizer that counts how often each element was updated.
struct Recorder {
  std::vector<int> times;
  void update(std::size_t off, std::size_t cnt) {
    for (std::size_t i = off; i < off + cnt; ++i) ++times[i];
  }
  void complete_step() {}
  // The parts it was asked to keep the state of (ascending).
  std::vector<std::pair<std::size_t, std::size_t>> parts;
  void shard_state(const std::vector<std::pair<std::size_t, std::size_t>>& p) { parts = p; }
  void unshard_state() {}
  void set_state_partial(bool) {}
  template <class F>
  void for_each_state_arena(F&&) {}
};
}  // namespace

TEST_CASE("sharded steps: a partial state is not saved; misuse is named") {
  std::mutex m;
  std::vector<std::string> failures;
  auto fail = [&](int r, const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    failures.push_back("rank " + std::to_string(r) + ": " + what);
  };
  run_loopback(2, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 30;
    Communicator comm(t, c);
    const int r = t.rank();
    const std::size_t n = 3000;
    std::vector<float> params(n, 1.0f), grads(n, 0.5f);
    const BufferView pv{span<float>(params)}, gv{span<float>(grads)};
    GradientSync sync(comm, gv, 4096);
    std::vector<double> wrong_type(n);
    bool threw = false;
    try {
      sync.shard_updates(BufferView(span<double>(wrong_type)));
    } catch (const InvalidArgument& e) {
      threw = std::string(e.what()).find("laid out as the gradients") != std::string::npos;
    }
    if (!threw) fail(r, "a parameter arena of another type was accepted");
    threw = false;
    try {
      sync.shard_updates(pv.slice(0, n - 1));
    } catch (const InvalidArgument&) {
      threw = true;
    }
    if (!threw) fail(r, "a parameter arena of another size was accepted");
    sync.shard_updates(pv);
    if (!sync.sharded()) fail(r, "not sharded after shard_updates");
    SgdOptions so;
    so.momentum = 0.9;
    Sgd sgd(pv, gv, Schedule::constant(0.1), so);
    // wait() without the optimizer: the gradients are scattered, nothing is updated; an error.
    threw = false;
    try {
      sync.sync_all();
    } catch (const InvalidArgument& e) {
      threw = std::string(e.what()).find("wait(optimizer)") != std::string::npos;
    }
    if (!threw) fail(r, "wait() without the optimizer was accepted");
    // An optimizer whose state is sharded over other parts: the error leaves wait(), the step's
    // collectives completed, and the sync takes the next step.
    Sgd elsewhere(pv, gv, Schedule::constant(0.1), so);
    elsewhere.shard_state({{0, 1}});
    sync.ready_all();
    threw = false;
    try {
      sync.wait(elsewhere);
    } catch (const InvalidArgument& e) {
      threw = std::string(e.what()).find("other parts") != std::string::npos;
    }
    if (!threw) fail(r, "an optimizer sharded over other parts was accepted");
    if (sync.buckets_started() != 0) fail(r, "the failed step's collectives were left running");
    // New gradients (rank r: r + 1, average 1.5): the step averages them, not the failed step's.
    // SGD's first step with momentum: p = 1 - 0.1 * 1.5 everywhere.
    std::fill(grads.begin(), grads.end(), static_cast<float>(r + 1));
    sync.ready_all();
    sync.wait(sgd);
    for (float p : params)
      if (std::fabs(p - 0.85f) > 1e-6f) {
        fail(r, "the step after a failed one did not average its own gradients");
        break;
      }
    if (!sgd.state_partial()) fail(r, "state not partial after a sharded step");
    // Saving refuses the partial state, naming what to do; loading keeps it in parts.
    Visitor save;
    threw = false;
    try {
      sgd.visit_state(save);
    } catch (const InvalidArgument& e) {
      threw = std::string(e.what()).find("gather_state") != std::string::npos;
    }
    if (!threw || save.tensors != 0) fail(r, "a partial state was saved");
    Visitor load;
    load.load = true;
    sgd.visit_state(load);
    if (!sgd.state_partial() || load.tensors != 1 || sgd.state_elements() != n / 2)
      fail(r, "loading did not keep the state in this rank's parts");
    sync.ready_all();
    sync.wait(sgd);
    sync.gather_state(sgd);
    Visitor again;
    sgd.visit_state(again);
    if (again.tensors != 1) fail(r, "the gathered state was not saved");
    // A sharded step updates this rank's part of each bucket only: n / 2 elements, each once.
    Recorder rec{std::vector<int>(n, 0), {}};
    sync.ready_all();
    sync.wait(rec);
    std::size_t once = 0, other = 0;
    for (int k : rec.times) (k == 1 ? once : other) += k == 0 ? 0 : 1;
    if (once != n / 2 || other != 0) fail(r, "the step updated more than this rank's parts");
    // The state is kept for exactly the updated elements, its parts ascending.
    std::size_t in_parts = 0, kept = 0, end = 0;
    bool ascending = true;
    for (const auto& [first, count] : rec.parts) {
      ascending = ascending && first >= end;
      end = first + count;
      kept += count;
      for (std::size_t i = first; i < first + count; ++i) in_parts += rec.times[i] == 1;
    }
    if (!ascending || in_parts != n / 2 || kept != n / 2)
      fail(r, "the state's parts are not the updated ones");
    // Both ranks applied the same steps: the same parameters (every element moved).
    if (params[0] == 1.0f || params[n - 1] == 1.0f) fail(r, "parameters not updated");
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

}  // namespace dtrain_test_comm_sharded_test
