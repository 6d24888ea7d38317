// The two-level all-reduces (hier, hier_leader) over loopback ranks grouped into nodes by an
// explicit rank -> node map: even, uneven and interleaved nodes, one rank per node, one node,
// with and without node-shared segments, against the wide-precision reference; the node
// grouping itself (NodeMap, DTRAIN_RANKS_PER_NODE) and the cost model's hierarchical terms.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/any_transport.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/transports/loopback.hpp>

#include "comm_test_util.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_hier_test {

using namespace dtrain;

namespace {

SharedSegmentConfig segments(bool enabled) {
  SharedSegmentConfig s;
  s.enabled = enabled;
  s.slot_bytes = 256;  // many chunks even for small counts: the slots are reused many times
  s.slots = 2;
  return s;
}

// Every rank runs hier and hier_leader (and shm / ring in between where all ranks share a node,
// so the shared counters must stay consistent across algorithms) on every count, dtype and op;
// each result is checked against the reference and against rank 0's bits.
void hier_matrix(const std::vector<int>& node_of, bool shm, const std::vector<std::size_t>& counts,
                 const std::vector<DType>& dtypes, const std::vector<ReduceOp>& ops) {
  LoopbackWorld world(node_of, segments(shm));
  const int p = world.size();
  std::vector<AllreduceAlgorithm> algos{AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader};
  if (world.node_map().nodes() == 1 && shm && p > 1) algos.push_back(AllreduceAlgorithm::shm);
  algos.push_back(AllreduceAlgorithm::hier);
  std::mutex m;
  std::vector<std::string> failures;
  std::vector<std::vector<std::uint64_t>> hashes(static_cast<std::size_t>(p));
  run_loopback(world, [&](LoopbackTransport& t) {
    CommConfig c;
    c.segment_bytes = 64;  // the inter-node rings run many segments
    c.timeout_s = 60;
    Communicator comm(t, c);
    std::uint64_t combo = 0;
    for (std::size_t count : counts)
      for (AllreduceAlgorithm algo : algos)
        for (DType dt : dtypes)
          for (ReduceOp op : ops) {
            ++combo;
            const std::size_t es = size_of(dt);
            std::vector<std::vector<unsigned char>> inputs(static_cast<std::size_t>(p));
            for (int r = 0; r < p; ++r) inputs[r] = test::make_input(dt, op, count, r, combo);
            std::vector<unsigned char> in = inputs[static_cast<std::size_t>(t.rank())];
            std::vector<unsigned char> out(count * es + 1, 0xAB);
            if (combo % 2) {
              comm.allreduce(BufferView(in.data(), count, dt), op, algo);
              if (count) std::memcpy(out.data(), in.data(), count * es);
            } else {
              comm.allreduce(BufferView(in.data(), count, dt), BufferView(out.data(), count, dt),
                             op, algo);
            }
            const long long bad = test::first_mismatch(dt, op, inputs, out.data(), count);
            if (bad >= 0 || out[count * es] != 0xAB) {
              std::lock_guard<std::mutex> lock(m);
              failures.push_back("rank " + std::to_string(t.rank()) + " " + name_of(algo) + " " +
                                 name_of(dt) + " " + name_of(op) + " count " +
                                 std::to_string(count) + ": element " + std::to_string(bad));
            }
            hashes[static_cast<std::size_t>(t.rank())].push_back(
                test::fnv1a(out.data(), count * es));
          }
  });
  INFO("nodes " << world.node_map().describe() << (shm ? " with" : " without") << " segments");
  for (const std::string& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
  for (int r = 1; r < p; ++r) CHECK(hashes[static_cast<std::size_t>(r)] == hashes[0]);
}

const std::vector<std::size_t> kCounts{0, 1, 3, 7, 1000, 4099};
const std::vector<DType> kTypes{DType::f32, DType::f64, DType::f16, DType::i32};
const std::vector<ReduceOp> kOps{ReduceOp::sum, ReduceOp::max, ReduceOp::avg};

}  // namespace

TEST_CASE("NodeMap: labels, local ranks, subdivision, shape") {
  const NodeMap m({7, 3, 7, 7, 3});  // interleaved labels
  CHECK(m.nodes() == 2);
  CHECK(m.members(0) == std::vector<int>{0, 2, 3});
  CHECK(m.members(1) == std::vector<int>{1, 4});
  CHECK(m.local_rank(3) == 2);
  CHECK(m.local_rank(4) == 1);
  CHECK(m.describe() == "3+2");
  const Topology s = m.shape();
  CHECK(s.nodes == 2);
  CHECK(s.max_ranks_per_node == 3);
  CHECK(s.min_ranks_per_node == 2);
  CHECK(s.hierarchical());
  const NodeMap d = NodeMap::subdivided({0, 0, 0, 1}, 2);  // {0,1} {2} {3}
  CHECK(d.nodes() == 3);
  CHECK(d.node_of(1) == 0);
  CHECK(d.node_of(2) == 1);
  CHECK(d.node_of(3) == 2);
  // The machines are the nodes before the cut: fake nodes share their machine's cores.
  CHECK(m.machine_ranks(1) == 2);
  CHECK(m.machine_ranks(3) == 3);
  CHECK(d.machine_ranks(0) == 3);
  CHECK(d.machine_ranks(2) == 3);
  CHECK(d.machine_ranks(3) == 1);
  CHECK(d.max_machine_ranks() == 3);
  CHECK(NodeMap::subdivided({0, 0, 0, 0}, 2).machine_ranks(3) == 4);
  CHECK(NodeMap::subdivided({0, 0, 0, 0}, 0).machine_ranks(3) == 4);
  CHECK(NodeMap::separate(3).max_machine_ranks() == 1);
  CHECK(NodeMap::single(4).describe() == "1x4");
  CHECK(!NodeMap::separate(4).shape().hierarchical());
  CHECK_THROWS_AS(NodeMap(std::vector<int>{}), InvalidArgument);
}

TEST_CASE("DTRAIN_RANKS_PER_NODE makes fake nodes of the loopback world, strictly parsed") {
  ::setenv("DTRAIN_RANKS_PER_NODE", "2", 1);
  {
    LoopbackWorld w(5);
    CHECK(w.node_map().describe() == "2+2+1");
    run_loopback(w, [&](LoopbackTransport& t) {
      Communicator comm(t, CommConfig{});
      CHECK(comm.topology().nodes == 3);
      CHECK(shared_segments_of(t) == nullptr);  // shm needs all ranks on one node
      const bool alone = t.rank() == 4;
      CHECK((node_segments_of(t) == nullptr) == alone);
      if (!alone) CHECK(node_segments_of(t)->size == 2);
    });
  }
  ::setenv("DTRAIN_RANKS_PER_NODE", "two", 1);
  CHECK_THROWS_AS(LoopbackWorld(2), InvalidArgument);
  ::setenv("DTRAIN_RANKS_PER_NODE", "0", 1);
  CHECK_THROWS_AS(LoopbackWorld(2), InvalidArgument);
  ::unsetenv("DTRAIN_RANKS_PER_NODE");
  LoopbackWorld one(3);
  CHECK(one.node_map().nodes() == 1);
}

TEST_CASE("DTRAIN_RANKS_PER_NODE as a list of node sizes: uneven fake nodes, strictly parsed") {
  ::setenv("DTRAIN_RANKS_PER_NODE", "3,1", 1);
  {
    LoopbackWorld w(4);
    CHECK(w.node_map().describe() == "3+1");
    CHECK(w.node_map().members(0) == std::vector<int>{0, 1, 2});
    run_loopback(w, [&](LoopbackTransport& t) {
      Communicator comm(t, CommConfig{});
      CHECK(comm.topology().nodes == 2);
      CHECK(comm.topology().max_ranks_per_node == 3);
      CHECK(comm.topology().min_ranks_per_node == 1);
      CHECK((node_segments_of(t) == nullptr) == (t.rank() == 3));
    });
  }
  ::setenv("DTRAIN_RANKS_PER_NODE", "1,2,2", 1);
  CHECK(LoopbackWorld(5).node_map().describe() == "1+2+2");
  CHECK(SharedSegmentConfig::from_env().ranks_per_node.sizes == std::vector<int>{1, 2, 2});
  CHECK(SharedSegmentConfig::from_env().ranks_per_node.every == 0);
  // Every rank's transport checks the sum against the group size, naming the variable.
  for (const char* bad : {"3,1", "2,2,2", "3,", ",3", "3,,1", "3,0", "3;1", "3, 1", "a,b"}) {
    ::setenv("DTRAIN_RANKS_PER_NODE", bad, 1);
    INFO(bad);
    bool named = false;
    try {
      LoopbackWorld w(5);
    } catch (const InvalidArgument& e) {
      named = std::string(e.what()).find("DTRAIN_RANKS_PER_NODE") != std::string::npos;
    }
    CHECK(named);
  }
  ::unsetenv("DTRAIN_RANKS_PER_NODE");
  // A listed node that spans two nodes of the system map is split there.
  RanksPerNode rpn;
  rpn.sizes = {3, 1};
  const NodeMap split = NodeMap::subdivided({0, 0, 1, 1}, rpn);
  CHECK(split.describe() == "2+1+1");
  CHECK(split.node_of(1) == 0);
  CHECK(split.node_of(2) == 1);
  CHECK(split.node_of(3) == 2);
  CHECK(split.machine_ranks(0) == 2);
  CHECK(split.machine_ranks(2) == 2);
}

TEST_CASE("hier and hier_leader: one node, one rank per node, 1-3 ranks") {
  for (bool shm : {true, false}) {
    hier_matrix({0}, shm, {0, 5}, {DType::f32}, {ReduceOp::sum});
    hier_matrix({0, 0}, shm, kCounts, kTypes, kOps);
    hier_matrix({0, 1}, shm, kCounts, kTypes, kOps);
    hier_matrix({0, 0, 1}, shm, kCounts, kTypes, kOps);  // uneven: 2 + 1
    hier_matrix({0, 1, 2}, shm, {1, 7, 1000}, {DType::f32}, {ReduceOp::sum});
  }
}

TEST_CASE("hier and hier_leader: 4-8 ranks in even, uneven and interleaved nodes") {
  for (bool shm : {true, false}) {
    hier_matrix({0, 0, 1, 1}, shm, kCounts, kTypes, kOps);    // 2x2
    hier_matrix({0, 0, 0, 1}, shm, kCounts, kTypes, kOps);    // 3 + 1
    hier_matrix({0, 1, 0, 1}, shm, {3, 1000}, kTypes, kOps);  // interleaved ranks
    hier_matrix({0, 0, 1, 1, 1}, shm, {1, 4, 1000}, {DType::f32, DType::i32}, kOps);
  }
  hier_matrix({0, 0, 0, 0, 0, 0, 0, 0}, true, {7, 4099}, {DType::f32}, {ReduceOp::sum});
  hier_matrix({0, 0, 0, 0, 1, 1, 1, 1}, true, {5, 4099}, {DType::f32, DType::f16},
              {ReduceOp::sum, ReduceOp::max});
  hier_matrix({0, 0, 0, 1, 1, 2, 2, 2}, false, {7, 1001}, {DType::f64, DType::i32},
              {ReduceOp::sum, ReduceOp::avg});
  hier_matrix({0, 1, 2, 3, 4, 5, 6, 7}, true, {6, 1000}, {DType::f32}, {ReduceOp::sum});
}

TEST_CASE("hier and hier_leader with each inter-node algorithm: ring, rhd, rd, tree") {
  for (AllreduceAlgorithm inter : {AllreduceAlgorithm::ring, AllreduceAlgorithm::rhd,
                                   AllreduceAlgorithm::rd, AllreduceAlgorithm::tree}) {
    INFO("between nodes: " << name_of(inter));
    detail::hier_inter_algorithm() = inter;
    hier_matrix({0, 0, 1, 1}, true, {1, 7, 1000, 4099}, {DType::f32, DType::i32}, kOps);
    hier_matrix({0, 0, 0, 1}, false, {3, 1000}, {DType::f32, DType::f16}, {ReduceOp::sum});
    hier_matrix({0, 1, 2, 2, 2}, true, {5, 1001}, {DType::f64}, {ReduceOp::sum, ReduceOp::avg});
  }
  detail::hier_inter_algorithm() = AllreduceAlgorithm::automatic;
  // Automatic: the model's cheapest between nodes, used by predict as by the algorithm.
  CostModel m;
  m.alpha = 1e-6;
  m.beta = 1e-10;
  m.gamma = 1e-11;
  m.inter_alpha = 20e-6;
  m.inter_beta = 1e-9;
  const CostModel between = m.between_nodes();
  CHECK(between.alpha == m.inter_alpha);
  CHECK(between.best_inter(64, 8) == AllreduceAlgorithm::rd);          // latency-bound
  CHECK(between.best_inter(64u << 20, 8) == AllreduceAlgorithm::rhd);  // bandwidth-bound
  // hier_leader at 64 MiB: the leaders' all-reduce is rhd now, where it used to be rd always.
  const Topology t{8, 4, 4};
  const std::size_t big = 64u << 20;
  const double nb = static_cast<double>(big);
  CHECK(m.predict(AllreduceAlgorithm::hier_leader, big, 32, t) ==
        doctest::Approx(2 * m.alpha + 3 * nb * (2 * m.beta + m.gamma) +
                        between.steps(AllreduceAlgorithm::rhd, big, 8)));
  CHECK(between.steps(AllreduceAlgorithm::rhd, big, 8) <
        between.steps(AllreduceAlgorithm::rd, big, 8));
  // With a model on every rank, automatic inter-node choice runs and agrees with the reference.
  LoopbackWorld world(std::vector<int>{0, 0, 1, 1, 2, 2}, segments(true));
  run_loopback(world, [&](LoopbackTransport& t) {
    Communicator comm(t, CommConfig{});
    CostModel big_latency = m;
    big_latency.inter_alpha = 1e-3;  // rd among 3 nodes' parts/leaders
    comm.set_cost_model(big_latency);
    std::vector<float> x(2000, static_cast<float>(t.rank() + 1));
    comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::hier);
    CHECK(x[1999] == 21.0f);
    std::vector<float> y(5, static_cast<float>(t.rank() + 1));
    comm.allreduce(BufferView(span<float>(y)), ReduceOp::sum, AllreduceAlgorithm::hier_leader);
    CHECK(y[4] == 21.0f);
  });
}

TEST_CASE("hier through AnyTransport keeps the node map and segments") {
  LoopbackWorld world(std::vector<int>{0, 0, 1, 1}, segments(true));
  run_loopback(world, [&](LoopbackTransport& lt) {
    AnyTransport t(lt);
    CHECK(t.node_map().describe() == "2x2");
    CHECK(t.node_segments() == lt.node_segments());
    Communicator comm(t, CommConfig{});
    std::vector<float> x(333, static_cast<float>(t.rank() + 1));
    comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::hier);
    CHECK(x[332] == 10.0f);
  });
}

namespace {
// 10 GB/s inside a node, 1 GB/s between nodes.
CostModel two_level_model() {
  CostModel m;
  m.alpha = 2e-6;
  m.beta = 1e-10;
  m.gamma = 1e-10;
  m.inter_alpha = 5e-6;
  m.inter_beta = 1e-9;
  return m;
}
}  // namespace

TEST_CASE("cost model: hierarchical algorithms only where nodes have several ranks") {
  CostModel m = two_level_model();
  const Topology two_by_four{2, 4, 4};
  const std::size_t big = 64u << 20;
  // Across the slow link hier moves 1/4 of the bytes per rank: it must win for large messages.
  CHECK(m.predict(AllreduceAlgorithm::hier, big, 8, two_by_four) <
        m.predict(AllreduceAlgorithm::ring, big, 8, two_by_four));
  CHECK(m.best(big, 8, two_by_four) == AllreduceAlgorithm::hier);
  // hier_leader's single leader exchange wins over a flat algorithm for tiny messages.
  CHECK(m.predict(AllreduceAlgorithm::hier_leader, 8, 8, two_by_four) <
        m.predict(AllreduceAlgorithm::ring, 8, 8, two_by_four));
  // One rank per node, or one node: never chosen.
  for (std::size_t b : {std::size_t{8}, big}) {
    const AllreduceAlgorithm a = m.best(b, 8, Topology::flat(8));
    CHECK(a != AllreduceAlgorithm::hier);
    CHECK(a != AllreduceAlgorithm::hier_leader);
    const AllreduceAlgorithm o = m.best(b, 8, Topology{1, 8, 8});
    CHECK(o != AllreduceAlgorithm::hier);
    CHECK(o != AllreduceAlgorithm::hier_leader);
  }
  // shm cannot span nodes.
  m.shm_alpha = 1e-7;
  m.shm_beta = 1e-11;
  CHECK(m.predict(AllreduceAlgorithm::shm, big, 8, two_by_four) >= 1e299);
  CHECK(m.best(big, 8, two_by_four) != AllreduceAlgorithm::shm);
  // The flat three-argument form still answers for the hierarchical names (one rank per node).
  CHECK(m.predict(AllreduceAlgorithm::hier, big, 8) > 0);
}

TEST_CASE("cost model: inter_share slows what crosses nodes from every rank at once") {
  CostModel m = two_level_model();
  m.shm_alpha = 1e-7;
  m.shm_beta = 1e-11;
  const Topology two_by_four{2, 4, 4};
  const std::size_t big = 64u << 20;
  auto at = [&](const CostModel& c, AllreduceAlgorithm a, const Topology& t) {
    return c.predict(a, big, 8, t);
  };
  CostModel shared = m;
  shared.inter_share = 4;  // four ranks of a node on one link
  // hier's parts cross from every rank: four times the per-byte cost between the nodes.
  const CostModel crossing = [&] {
    CostModel c = m.between_nodes();
    c.beta *= 4;
    return c;
  }();
  const std::size_t part = big / 4;
  CHECK(at(shared, AllreduceAlgorithm::hier, two_by_four) ==
        doctest::Approx(m.call + m.steps(AllreduceAlgorithm::shm, big, 4) +
                        crossing.steps(crossing.best_inter(part, 2), part, 2)));
  CHECK(at(shared, AllreduceAlgorithm::rhd, two_by_four) ==
        doctest::Approx(crossing.steps(AllreduceAlgorithm::rhd, big, 8)));
  CHECK(at(shared, AllreduceAlgorithm::rd, two_by_four) >
        at(m, AllreduceAlgorithm::rd, two_by_four));
  // One rank of a node crosses at a time: unchanged.
  for (AllreduceAlgorithm a :
       {AllreduceAlgorithm::hier_leader, AllreduceAlgorithm::ring, AllreduceAlgorithm::tree})
    CHECK(at(shared, a, two_by_four) == at(m, a, two_by_four));
  // One rank per node: no sharing, whatever the factor; one node: no crossing at all.
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd}) {
    CHECK(at(shared, a, Topology::flat(8)) == at(m, a, Topology::flat(8)));
    CHECK(at(shared, a, Topology{1, 8, 8}) == at(m, a, Topology{1, 8, 8}));
  }
  // Sharing the link makes hier_leader, which crosses with the whole vector from one rank, the
  // better choice where hier's parts were cheaper.
  CHECK(at(m, AllreduceAlgorithm::hier, two_by_four) <
        at(m, AllreduceAlgorithm::hier_leader, two_by_four));
  shared.inter_share = 8;
  CHECK(at(shared, AllreduceAlgorithm::hier, two_by_four) >
        at(shared, AllreduceAlgorithm::hier_leader, two_by_four));
}

TEST_CASE(
    "cost model: a flat algorithm across nodes pays the slower of the links inside and between") {
  // Every rank of a flat algorithm sends at once, some inside a node, some between nodes: each
  // step ends with the slower link. On a cluster that is the one between nodes; on fake nodes
  // the pair between nodes, measured while the other ranks sleep, can be the faster.
  const Topology two_by_two{2, 2, 2};
  const std::size_t big = 4u << 20;
  CostModel slow_between = two_level_model();  // inter 5 us, 1 ns/B; inside 2 us, 0.1 ns/B
  CostModel fast_between = slow_between;
  fast_between.inter_alpha = 1e-6;
  fast_between.inter_beta = 2e-11;
  const CostModel inside = slow_between;  // alpha, beta as measured inside a node
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                               AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd}) {
    CAPTURE(a);
    CHECK(slow_between.predict(a, big, 4, two_by_two) ==
          doctest::Approx(slow_between.between_nodes().steps(a, big, 4)));
    CHECK(fast_between.predict(a, big, 4, two_by_two) == doctest::Approx(inside.steps(a, big, 4)));
  }
  // hier_leader's leaders cross alone: it keeps the fast link between nodes (inside its node,
  // one message round each way where shm was not measured).
  const CostModel& m = fast_between;
  const CostModel leaders = m.between_nodes();
  const double n = static_cast<double>(big);
  CHECK(m.predict(AllreduceAlgorithm::hier_leader, big, 4, two_by_two) ==
        doctest::Approx(2 * m.alpha + n * (2 * m.beta + m.gamma) +
                        leaders.steps(leaders.best_inter(big, 2), big, 2)));
}

TEST_CASE("cost model: a fixed per-call cost and the cache switch of the per-byte terms") {
  CostModel m;
  m.alpha = 1e-6;
  m.beta = 1e-10;
  m.gamma = 5e-11;
  const Topology two_nodes{2, 2, 2};
  const double ring = m.predict(AllreduceAlgorithm::ring, 4096, 4);
  const double hier = m.predict(AllreduceAlgorithm::hier, 4096, 4, two_nodes);
  m.call = 3e-6;  // added once per call, whatever the algorithm, also around hier's parts
  CHECK(m.predict(AllreduceAlgorithm::ring, 4096, 4) == doctest::Approx(ring + 3e-6));
  CHECK(m.predict(AllreduceAlgorithm::hier, 4096, 4, two_nodes) == doctest::Approx(hier + 3e-6));
  CHECK(m.steps(AllreduceAlgorithm::ring, 4096, 4) == doctest::Approx(ring));
  CHECK(m.predict(AllreduceAlgorithm::ring, 4096, 1) == 0);
  // Beyond the cache (2 * bytes * cache_ranks > cache_bytes) beta and gamma grow by mem_factor.
  m.call = 0;
  m.cache_bytes = 32.0 * (1 << 20);
  m.cache_ranks = 2;
  m.mem_factor = 2.5;
  const std::size_t in_cache = 8u << 20, beyond = (8u << 20) + 4;
  CHECK(m.predict(AllreduceAlgorithm::ring, in_cache, 2) ==
        doctest::Approx(m.steps(AllreduceAlgorithm::ring, in_cache, 2)));
  CostModel slow = m;
  slow.beta *= 2.5;
  slow.gamma *= 2.5;
  CHECK(m.predict(AllreduceAlgorithm::ring, beyond, 2) ==
        doctest::Approx(slow.steps(AllreduceAlgorithm::ring, beyond, 2)));
  CHECK(m.best(beyond, 2) == slow.best(beyond, 2));
}

}  // namespace dtrain_test_comm_hier_test
