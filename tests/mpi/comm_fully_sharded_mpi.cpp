// Fully sharded training on real MPI (mpiexec -n 2, 3): three AdamW steps of a small MLP give
// each rank's parts of the parameters the bits of the replicated step (GradientSync's all-reduce)
// in reproducible mode, with the model in private memory and in the node-shared heap, with two
// working buffers and with one (the memory-tight mode), and on the emulated device (device memory
// MPI cannot reach: staged through host buffers).
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>

#include "../support/emulated_device.hpp"
#include "../support/fully_sharded.hpp"

namespace dtrain_test_comm_fully_sharded_mpi {

using namespace dtrain;

namespace {

// Rank `rank`'s inputs and labels at `step`.
void make_batch(int rank, int step, std::vector<float>& x, std::vector<std::int32_t>& y) {
  const std::uint64_t seed = static_cast<std::uint64_t>(rank * 100 + step);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = test::hashed_value(seed, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((seed + i) % 4);
}

// Parameters after 3 steps: whole (replicated) or this rank's parts (fully sharded).
std::vector<float> train(Communicator<MpiTransport>& comm, bool sharded, bool heap, int buffers,
                         StateParts& parts) {
  Allocator& a = heap ? comm.shared_allocator() : default_allocator();
  Sequential model({Linear(12, 32), Gelu(), Linear(32, 32), Tanh(), Linear(32, 4)}, a);
  model.init(9);
  std::unique_ptr<FullyShardedSync<Sequential>> fs;
  std::unique_ptr<GradientSync> sync;
  FullyShardedOptions options;
  options.buffers = buffers;
  if (sharded)
    fs = std::make_unique<FullyShardedSync<Sequential>>(comm, model, options);
  else
    sync = std::make_unique<GradientSync>(comm, model.gradients(), 1024);
  AdamW opt(model, Schedule::constant(0.01));
  const std::int64_t rows = 6;
  std::vector<float> x(rows * 12);
  std::vector<std::int32_t> y(rows);
  for (int step = 0; step < 3; ++step) {
    make_batch(comm.rank(), step, x, y);
    test::fully_sharded_or_replicated_step(model, x.data(), y.data(), rows,
                                           Loss::softmax_cross_entropy, fs.get(), sync.get(), opt);
  }
  parts = model.arena_parts();
  const auto v = model.parameter_span();
  return std::vector<float>(v.begin(), v.end());
}

// The same steps fully sharded on the emulated device: this rank's parts of the parameters.
std::vector<float> train_device(Communicator<MpiTransport>& comm, int buffers, StateParts& parts,
                                bool& staged) {
  using Exec = test::EmulatedDevice;
  using Model = BasicSequential<float, Exec>;
  Exec dev;
  Model model(std::vector<LayerSpec>{Linear(12, 32), Gelu(), Linear(32, 32), Tanh(), Linear(32, 4)},
              dev);
  model.init(9);
  FullyShardedOptions options;
  options.buffers = buffers;
  FullyShardedSync<Model> fs(comm, model, options);
  staged = fs.staged();
  BasicAdamW<Exec> opt(model, Schedule::constant(0.01));
  const std::int64_t rows = 6;
  std::vector<float> x(rows * 12);
  std::vector<std::int32_t> y(rows);
  for (int step = 0; step < 3; ++step) {
    make_batch(comm.rank(), step, x, y);
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), rows);
    fs.wait(opt);
  }
  parts = model.arena_parts();
  const std::vector<unsigned char> b = test::bytes_of(dev, model.parameters());
  std::vector<float> out(b.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), b.data(), b.size());
  return out;
}

}  // namespace

TEST_CASE("fully sharded steps on MPI give the replicated step's bits (reproducible mode)") {
  SharedSegmentConfig seg = SharedSegmentConfig::from_env();
  seg.heap_bytes = 4 << 20;
  MpiTransport transport(MPI_COMM_WORLD, seg);
  CommConfig c;
  c.reproducible = true;
  c.timeout_s = 60;
  Communicator comm(transport, c);
  for (bool heap : {false, true}) {
    CAPTURE(heap);
    StateParts none;
    const std::vector<float> whole = train(comm, false, heap, 2, none);
    for (int buffers : {2, 1}) {
      CAPTURE(buffers);
      StateParts parts;
      const std::vector<float> mine = train(comm, true, heap, buffers, parts);
      std::vector<float> want;
      for (const auto& [first, count] : parts)
        want.insert(want.end(), whole.begin() + static_cast<std::ptrdiff_t>(first),
                    whole.begin() + static_cast<std::ptrdiff_t>(first + count));
      REQUIRE(want.size() == mine.size());
      CHECK(std::memcmp(want.data(), mine.data(), want.size() * sizeof(float)) == 0);
    }
    if (heap) continue;
    for (int buffers : {1, 2}) {
      CAPTURE(buffers);
      StateParts parts;
      bool staged = false;
      const std::vector<float> mine = train_device(comm, buffers, parts, staged);
      CHECK(staged == (comm.size() > 1));
      std::vector<float> want;
      for (const auto& [first, count] : parts)
        want.insert(want.end(), whole.begin() + static_cast<std::ptrdiff_t>(first),
                    whole.begin() + static_cast<std::ptrdiff_t>(first + count));
      REQUIRE(want.size() == mine.size());
      CHECK(std::memcmp(want.data(), mine.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace dtrain_test_comm_fully_sharded_mpi
