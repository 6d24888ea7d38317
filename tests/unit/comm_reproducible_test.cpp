// Reproducible mode over the loopback transport: every requested algorithm, segment size and
// shm slot size gives the bits of a serial rank-order reduction computed here, and a short
// training gives the same parameters whatever the bucket size and the algorithm.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/sequential.hpp>
#include <dtrain/optim/sgd.hpp>
#include <dtrain/transports/loopback.hpp>

#include "comm_test_util.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_reproducible_test {

using namespace dtrain;

namespace {

// Rank q's input: values spread over many binades with both signs, so that almost any two
// summation orders round differently somewhere.
std::vector<unsigned char> spread_input(DType t, std::size_t count, int rank, std::uint64_t combo) {
  std::vector<unsigned char> out(count * size_of(t));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t bits = test::splitmix64(combo * 7919 + rank * 1000003ull + i);
    const double mant = 1.0 + static_cast<double>(bits >> 11 & 0xFFFFF) * 0x1.0p-20;
    const int expo = static_cast<int>(bits % 24) - 12;
    const double v = ((bits >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(mant, expo);
    switch (t) {
      case DType::f32: {
        const float f = static_cast<float>(v);
        std::memcpy(&out[i * 4], &f, 4);
        break;
      }
      case DType::f64: std::memcpy(&out[i * 8], &v, 8); break;
      case DType::f16: {
        const half h(static_cast<float>(v));
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      case DType::bf16: {
        const bfloat16 h(static_cast<float>(v));
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      default: break;
    }
  }
  return out;
}

// The reference: for each element, ((x0 + x1) + x2) + ... in f64 for f64 and in f32 otherwise
// (inputs loaded exactly, 16-bit ones widened), avg divided by p once, results rounded once.
template <class Acc>
void store_acc(Acc v, unsigned char* p, DType t) {
  switch (t) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::f64: {
      const double d = static_cast<double>(v);
      std::memcpy(p, &d, 8);
      break;
    }
    case DType::f16: {
      const half h(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    default: {
      const bfloat16 h(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
  }
}
template <class Acc>
std::vector<unsigned char> rank_order_reference_as(
    DType t, ReduceOp op, const std::vector<std::vector<unsigned char>>& in, std::size_t count) {
  const std::size_t es = size_of(t);
  const int p = static_cast<int>(in.size());
  std::vector<unsigned char> out(count * es);
  for (std::size_t i = 0; i < count; ++i) {
    Acc acc = static_cast<Acc>(test::load_float(&in[0][i * es], t));
    for (int q = 1; q < p; ++q) acc = acc + static_cast<Acc>(test::load_float(&in[q][i * es], t));
    if (op == ReduceOp::avg) acc = acc / static_cast<Acc>(p);
    store_acc<Acc>(acc, &out[i * es], t);
  }
  return out;
}
std::vector<unsigned char> rank_order_reference(DType t, ReduceOp op,
                                                const std::vector<std::vector<unsigned char>>& in,
                                                std::size_t count) {
  return t == DType::f64 ? rank_order_reference_as<double>(t, op, in, count)
                         : rank_order_reference_as<float>(t, op, in, count);
}

const AllreduceAlgorithm kRequested[] = {
    AllreduceAlgorithm::automatic,  AllreduceAlgorithm::ring,        AllreduceAlgorithm::tree,
    AllreduceAlgorithm::rhd,        AllreduceAlgorithm::rd,          AllreduceAlgorithm::shm,
    AllreduceAlgorithm::ordered,    AllreduceAlgorithm::ordered_shm, AllreduceAlgorithm::hier,
    AllreduceAlgorithm::hier_leader};

struct Failures {
  std::mutex m;
  std::vector<std::string> what;
  void add(std::string s) {
    std::lock_guard<std::mutex> lock(m);
    if (what.size() < 20) what.push_back(std::move(s));
  }
};

void set_shm_slot(std::size_t bytes) {
  ::setenv("DTRAIN_SHM_SLOT_BYTES", std::to_string(bytes).c_str(), 1);
}

}  // namespace

TEST_CASE("reproducible mode: every algorithm gives the rank-order bits") {
  const DType dtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg};
  // (segment bytes, shm slot bytes): many small segments and chunks, and one of each.
  const std::size_t seg_cfg[][2] = {{64, 256}, {1024, 4096}, {256 * 1024, 256 * 1024}};
  for (int p = 1; p <= 8; ++p) {
    const std::vector<std::size_t> counts = {1, static_cast<std::size_t>(p > 1 ? p - 1 : 1), 7, 77,
                                             1001};
    for (const auto& sc : seg_cfg) {
      CAPTURE(p);
      CAPTURE(sc[0]);
      set_shm_slot(sc[1]);
      Failures f;
      std::atomic<int> compared{0};
      run_loopback(p, [&](LoopbackTransport& t) {
        CommConfig cfg;
        cfg.timeout_s = 60;
        cfg.segment_bytes = sc[0];
        cfg.reproducible = true;
        Communicator comm(t, cfg);
        std::uint64_t combo = 0;
        for (std::size_t count : counts)
          for (DType dt : dtypes)
            for (ReduceOp op : ops) {
              ++combo;
              const std::size_t es = size_of(dt);
              std::vector<std::vector<unsigned char>> in(static_cast<std::size_t>(p));
              for (int q = 0; q < p; ++q) in[q] = spread_input(dt, count, q, combo);
              const auto want = rank_order_reference(dt, op, in, count);
              for (AllreduceAlgorithm a : kRequested) {
                // In place and out of place alternate.
                std::vector<unsigned char> buf = in[t.rank()], out(count * es);
                const bool inplace = (combo + static_cast<int>(a)) % 2 == 0;
                BufferView src(buf.data(), count, dt), dst(out.data(), count, dt);
                if (inplace) {
                  comm.allreduce(src, op, a);
                  out = buf;
                } else {
                  comm.allreduce(src, dst, op, a);
                }
                ++compared;
                if (out != want)
                  f.add(detail::concat("rank ", t.rank(), ": ", name_of(a), " ", name_of(dt), " ",
                                       name_of(op), " count ", count, inplace ? " in place" : ""));
              }
              // reduce_scatter in reproducible mode: this rank's part of the same bits.
              const std::size_t b0 = partition_begin(count, p, t.rank()),
                                bl = partition_count(count, p, t.rank());
              std::vector<unsigned char> part(bl * es + 1);
              comm.reduce_scatter(BufferView(in[t.rank()].data(), count, dt),
                                  BufferView(part.data(), bl, dt), op);
              if (bl && std::memcmp(part.data(), want.data() + b0 * es, bl * es) != 0)
                f.add(detail::concat("rank ", t.rank(), ": reduce_scatter ", name_of(dt), " count ",
                                     count));
            }
      });
      for (const auto& w : f.what) FAIL_CHECK(w);
      CHECK(compared.load() == p * static_cast<int>(counts.size() * 4 * 2 *
                                                    (sizeof(kRequested) / sizeof(kRequested[0]))));
    }
  }
  ::unsetenv("DTRAIN_SHM_SLOT_BYTES");
}

TEST_CASE("reproducible mode maps every request to an ordered algorithm") {
  run_loopback(3, [](LoopbackTransport& t) {
    CommConfig cfg;
    cfg.timeout_s = 30;
    cfg.reproducible = true;
    Communicator comm(t, cfg);
    std::vector<float> v(10, 1.0f);
    BufferView b{span<float>(v)};
    auto algo_of = [&](AllreduceAlgorithm a) {
      return comm.plan_allreduce(b, b, ReduceOp::sum, a).algorithm();
    };
    const bool ok = algo_of(AllreduceAlgorithm::ring) == AllreduceAlgorithm::ordered &&
                    algo_of(AllreduceAlgorithm::tree) == AllreduceAlgorithm::ordered &&
                    algo_of(AllreduceAlgorithm::rhd) == AllreduceAlgorithm::ordered &&
                    algo_of(AllreduceAlgorithm::rd) == AllreduceAlgorithm::ordered &&
                    algo_of(AllreduceAlgorithm::shm) == AllreduceAlgorithm::ordered_shm &&
                    algo_of(AllreduceAlgorithm::automatic) == AllreduceAlgorithm::ordered_shm &&
                    algo_of(AllreduceAlgorithm::hier) == AllreduceAlgorithm::ordered_shm &&
                    comm.select_allreduce(1 << 20, DType::f32) == AllreduceAlgorithm::ordered_shm;
    if (!ok) raise<Error>("mapping", "reproducible mode ran a non-ordered algorithm");
  });
  // Without shared segments, automatic maps to the message-based one.
  SharedSegmentConfig none;
  none.enabled = false;
  LoopbackWorld world(2, none);
  std::atomic<int> good{0};
  std::vector<std::thread> th;
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      LoopbackTransport t(world, r);
      CommConfig cfg;
      cfg.reproducible = true;
      Communicator comm(t, cfg);
      if (comm.select_allreduce(100, DType::f32) == AllreduceAlgorithm::ordered) ++good;
    });
  for (auto& x : th) x.join();
  CHECK(good.load() == 2);
  CHECK(allreduce_algorithm_from_name("ordered_shm") == AllreduceAlgorithm::ordered_shm);
  CHECK(reproducible_counterpart(AllreduceAlgorithm::rhd, true) == AllreduceAlgorithm::ordered);
}

TEST_CASE("without reproducible mode the other algorithms round differently (the test can fail)") {
  // Four ranks: ring, tree and rhd each add some elements in an order other than rank order.
  const int p = 4;
  const std::size_t count = 1000;
  std::vector<std::vector<unsigned char>> in(p);
  for (int q = 0; q < p; ++q) in[q] = spread_input(DType::f32, count, q, 99);
  const auto want = rank_order_reference(DType::f32, ReduceOp::sum, in, count);
  const AllreduceAlgorithm others[] = {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                                       AllreduceAlgorithm::rhd};
  std::atomic<int> differ[3] = {{0}, {0}, {0}};
  std::atomic<int> ordered_equal{0};
  run_loopback(p, [&](LoopbackTransport& t) {
    CommConfig cfg;
    cfg.timeout_s = 30;
    cfg.segment_bytes = 256;
    Communicator comm(t, cfg);
    for (int k = 0; k < 3; ++k) {
      std::vector<unsigned char> buf = in[t.rank()];
      comm.allreduce(BufferView(buf.data(), count, DType::f32), ReduceOp::sum, others[k]);
      if (buf != want) ++differ[k];
    }
    for (AllreduceAlgorithm a : {AllreduceAlgorithm::ordered, AllreduceAlgorithm::ordered_shm}) {
      std::vector<unsigned char> buf = in[t.rank()];
      comm.allreduce(BufferView(buf.data(), count, DType::f32), ReduceOp::sum, a);
      if (buf == want) ++ordered_equal;
    }
  });
  for (int k = 0; k < 3; ++k) {
    CAPTURE(name_of(others[k]));
    CHECK(differ[k].load() == p);
  }
  CHECK(ordered_equal.load() == 2 * p);
}

namespace {
// A short training on 3 thread ranks (Linear-Tanh-Linear, softmax cross-entropy, SGD with
// momentum, 6 steps, gradients averaged bucket by bucket while backward runs); returns rank 0's
// final parameters, and counts ranks whose parameters differ from rank 0's.
std::vector<float> train(bool reproducible, std::size_t bucket_bytes, AllreduceAlgorithm algo,
                         std::atomic<int>& replicas_differ) {
  const int p = 3;
  const std::int64_t batch = 8, in_f = 12, classes = 5;
  std::vector<std::vector<float>> finals(p);
  run_loopback(p, [&](LoopbackTransport& t) {
    CommConfig cfg;
    cfg.timeout_s = 60;
    cfg.segment_bytes = 128;
    cfg.reproducible = reproducible;
    Communicator comm(t, cfg);
    Sequential model{Linear(in_f, 24), Tanh(), Linear(24, 24), Tanh(), Linear(24, classes)};
    model.init(7);
    SgdOptions so;
    so.momentum = 0.9;
    Sgd opt(model, Schedule::constant(0.05), so);
    GradientSync sync(comm, model.gradients(), bucket_bytes, algo);
    std::vector<float> x(static_cast<std::size_t>(batch * in_f));
    std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
    for (int step = 0; step < 6; ++step) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::uint64_t b = test::splitmix64(step * 100003ull + t.rank() * 7919ull + i);
        x[i] = static_cast<float>(static_cast<double>(b >> 11) * 0x1.0p-53 * 4.0 - 2.0);
      }
      for (std::size_t i = 0; i < y.size(); ++i)
        y[i] = static_cast<std::int32_t>(test::splitmix64(step * 31ull + t.rank() * 17ull + i) %
                                         classes);
      model.zero_grad();
      model.forward_backward(x.data(), y.data(), batch, Loss::softmax_cross_entropy, sync);
      sync.wait();
      opt.step();
    }
    auto ps = model.parameter_span();
    finals[t.rank()].assign(ps.begin(), ps.end());
  });
  for (int q = 1; q < p; ++q)
    if (finals[q] != finals[0]) ++replicas_differ;
  return finals[0];
}
}  // namespace

TEST_CASE("gradient sync: reproducible training is bitwise independent of buckets and algorithm") {
  std::atomic<int> replicas_differ{0};
  const auto a = train(true, 256, AllreduceAlgorithm::ring, replicas_differ);
  const auto b = train(true, 1 << 20, AllreduceAlgorithm::rhd, replicas_differ);
  const auto c = train(true, 1000, AllreduceAlgorithm::automatic, replicas_differ);
  CHECK(replicas_differ.load() == 0);
  CHECK(a.size() > 500);
  CHECK(a == b);
  CHECK(a == c);
  // Control: the same trainings without the mode drift apart, so the comparison above has teeth.
  const auto d = train(false, 256, AllreduceAlgorithm::ring, replicas_differ);
  const auto e = train(false, 1 << 20, AllreduceAlgorithm::rhd, replicas_differ);
  CHECK(d != e);
  CHECK(replicas_differ.load() == 0);
}

TEST_CASE("DTRAIN_COMM_REPRODUCIBLE is read strictly by CommConfig::from_env") {
  ::unsetenv("DTRAIN_COMM_REPRODUCIBLE");
  CHECK_FALSE(CommConfig::from_env().reproducible);
  ::setenv("DTRAIN_COMM_REPRODUCIBLE", "1", 1);
  CHECK(CommConfig::from_env().reproducible);
  ::setenv("DTRAIN_COMM_REPRODUCIBLE", "0", 1);
  CHECK_FALSE(CommConfig::from_env().reproducible);
  ::setenv("DTRAIN_COMM_REPRODUCIBLE", "sometimes", 1);
  std::string what;
  try {
    (void)CommConfig::from_env();
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  CHECK(what.find("DTRAIN_COMM_REPRODUCIBLE") != std::string::npos);
  ::setenv("DTRAIN_ALLREDUCE_ALGO", "ordered_shm", 1);
  ::setenv("DTRAIN_COMM_REPRODUCIBLE", "1", 1);
  const CommConfig c = CommConfig::from_env();
  CHECK(c.default_algorithm == AllreduceAlgorithm::ordered_shm);
  ::unsetenv("DTRAIN_ALLREDUCE_ALGO");
  ::unsetenv("DTRAIN_COMM_REPRODUCIBLE");
}

}  // namespace dtrain_test_comm_reproducible_test
