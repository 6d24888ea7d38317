// Several MPI ranks sharing one GPU (mpiexec -n 2, 4 on a one-GPU machine, from
// tests/gpu/run_on_device.sh), in reproducible mode, with a small convolutional model:
// - data parallel: the gradients GradientSync leaves on the device are, bit for bit, the
//   rank-order average of every rank's own device gradients (gathered here with MPI_Allgather and
//   summed on the host in rank order: the reduction contract's reference);
// - fully sharded: three SGD steps give each rank's parts the bits of the replicated steps on
//   the same device, and the replicated parameters stay within rounding of the host run's;
// - device IPC: the same average through CUDA/HIP IPC among the ranks (DTRAIN_DEVICE_IPC=1),
//   bit for bit the staged path's (DTRAIN_DEVICE_IPC=0), with the handles reused for two steps.
// Built by nvcc or hipcc it runs on the GPU (GpuExec); built by a plain C++ compiler it runs the
// same code on the emulated GPU of the tests (the device functors on the CPU: a dry run without a
// GPU).
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>

#include "support/fully_sharded.hpp"

#if DTRAIN_DEVICE_CODE
#include <dtrain/kernels/gpu_exec.cuh>
#else
#include "support/emulated_device.hpp"
#endif

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_mpi_gpu_test {

using namespace dtrain;
#if DTRAIN_DEVICE_CODE
using Exec = GpuExec;
#else
using Exec = test::EmulatedGpu;
#endif

namespace {
using Model = BasicSequential<float, Exec>;

std::vector<LayerSpec> layers() {
  return {Input{2, 8, 8},
          Conv2d(2, 4, 3).with_padding(1),
          Relu(),
          MaxPool2d(2),
          Conv2d(4, 4, 3).with_padding(1, dtrain::Padding::periodic),
          Tanh(),
          Linear(64, 4)};
}

// Rank `rank`'s inputs and labels at `step`.
void make_batch(int rank, int step, std::vector<float>& x, std::vector<std::int32_t>& y) {
  const std::uint64_t seed = static_cast<std::uint64_t>(rank * 100 + step);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = test::hashed_value(seed, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((seed + i) % 4);
}

std::vector<float> download(Exec& exec, BufferView v) {
  std::vector<float> out(v.count);
  if (v.count == 0) return out;
  exec.copy_d2h(exec.compute_stream(), out.data(), v.data, v.count * sizeof(float));
  exec_synchronize(exec, exec.compute_stream(), 60, "test download");
  return out;
}

struct Fixture {
  MpiTransport transport{MPI_COMM_WORLD};
  CommConfig config = [] {
    CommConfig c;
    c.reproducible = true;
    c.timeout_s = 120;
    return c;
  }();
  Communicator<MpiTransport> comm{transport, config};
};

const std::int64_t kRows = 5;

// Parameters after 3 SGD steps on the device: whole (replicated) or this rank's parts.
std::vector<float> train(Communicator<MpiTransport>& comm, Exec& exec, bool sharded,
                         StateParts& parts, bool& staged) {
  Model model(layers(), exec);
  model.init(9);
  std::unique_ptr<FullyShardedSync<Model>> fs;
  std::unique_ptr<BasicGradientSync<Exec>> sync;
  if (sharded) {
    fs = std::make_unique<FullyShardedSync<Model>>(comm, model);
    staged = fs->staged();
  } else {
    sync = std::make_unique<BasicGradientSync<Exec>>(exec, comm, model.gradients(), 512);
    staged = sync->staged();
  }
  BasicSgd<Exec> opt(model, Schedule::constant(0.05));  // not AdamW: it amplifies rounding
  std::vector<float> x(static_cast<std::size_t>(kRows * model.in_features()));
  std::vector<std::int32_t> y(kRows);
  for (int step = 0; step < 3; ++step) {
    make_batch(comm.rank(), step, x, y);
    model.zero_grad();
    if (fs) {
      model.forward_backward(x.data(), y.data(), kRows);
      fs->wait(opt);
    } else {
      model.forward_backward(x.data(), y.data(), kRows, Loss::softmax_cross_entropy, *sync);
      sync->wait();
      opt.step();
    }
  }
  parts = model.arena_parts();
  return download(exec, model.parameters());
}

// The same replicated steps on the host.
std::vector<float> train_host(Communicator<MpiTransport>& comm) {
  Sequential model(layers());
  model.init(9);
  GradientSync sync(comm, model.gradients(), 512);
  Sgd opt(model, Schedule::constant(0.05));
  std::vector<float> x(static_cast<std::size_t>(kRows * model.in_features()));
  std::vector<std::int32_t> y(kRows);
  for (int step = 0; step < 3; ++step) {
    make_batch(comm.rank(), step, x, y);
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), kRows, Loss::softmax_cross_entropy, sync);
    sync.wait();
    opt.step();
  }
  const auto v = model.parameter_span();
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("data parallel on the device: the rank-order average of every rank's gradients") {
  Fixture f;
  const int p = f.comm.size();
  Exec exec;
  Model model(layers(), exec);
  model.init(9);
  std::vector<float> x(static_cast<std::size_t>(kRows * model.in_features()));
  std::vector<std::int32_t> y(kRows);
  make_batch(f.comm.rank(), 0, x, y);
  // This rank's own gradients (the device kernels are deterministic: the synced pass below
  // computes the same bits before reducing them).
  model.zero_grad();
  model.forward_backward(x.data(), y.data(), kRows).get();
  const std::vector<float> own = download(exec, model.gradients());
  const int n = static_cast<int>(own.size());
  std::vector<float> all(own.size() * static_cast<std::size_t>(p));
  MPI_Allgather(own.data(), n, MPI_FLOAT, all.data(), n, MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<float> want(own.size());
  for (std::size_t i = 0; i < own.size(); ++i) {
    float acc = all[i];
    for (int q = 1; q < p; ++q) acc = acc + all[static_cast<std::size_t>(q) * own.size() + i];
    want[i] = acc / static_cast<float>(p);
  }
  BasicGradientSync<Exec> sync(exec, f.comm, model.gradients(), 512);
  MESSAGE("rank " << f.comm.rank() << " of " << p << ": gradient buckets "
                  << std::string(sync.staged() ? "staged through host memory"
                                               : "handed over on the device"));
  model.zero_grad();
  model.forward_backward(x.data(), y.data(), kRows, Loss::softmax_cross_entropy, sync);
  sync.wait();
  const std::vector<float> got = download(exec, model.gradients());
  CHECK(test::same_bits(got, want));
}

TEST_CASE("device IPC among the ranks: the rank-order average and the staged path's bits") {
  Fixture f;
  const int p = f.comm.size();
#if DTRAIN_DEVICE_CODE
  Exec exec;
#else
  test::EmulatedDevice::Options o;
  o.ipc = true;  // windows other processes map through /proc/<pid>/fd
  Exec exec(o);
#endif
  Model model(layers(), exec);
  model.init(9);
  std::vector<float> x(static_cast<std::size_t>(kRows * model.in_features()));
  std::vector<std::int32_t> y(kRows);
  make_batch(f.comm.rank(), 1, x, y);
  model.zero_grad();
  model.forward_backward(x.data(), y.data(), kRows).get();
  const std::vector<float> own = download(exec, model.gradients());
  const int n = static_cast<int>(own.size());
  std::vector<float> all(own.size() * static_cast<std::size_t>(p));
  MPI_Allgather(own.data(), n, MPI_FLOAT, all.data(), n, MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<float> want(own.size());
  for (std::size_t i = 0; i < own.size(); ++i) {
    float acc = all[i];
    for (int q = 1; q < p; ++q) acc = acc + all[static_cast<std::size_t>(q) * own.size() + i];
    want[i] = acc / static_cast<float>(p);
  }
  // Device IPC forced (an error where it cannot be used), then staged through host memory.
  std::vector<float> got[2];
  for (int ipc = 1; ipc >= 0; --ipc) {
    ::setenv("DTRAIN_DEVICE_IPC", ipc ? "1" : "0", 1);
    ::setenv("DTRAIN_MPI_GPU_AWARE", "0", 1);
    {
      BasicGradientSync<Exec> sync(exec, f.comm, model.gradients(), 512);
      CHECK(sync.device_ipc() == (ipc == 1));
      CHECK(sync.staged() == (ipc == 0));
      for (int step = 0; step < 2; ++step) {  // the same handles serve every step
        model.zero_grad();
        model.forward_backward(x.data(), y.data(), kRows, Loss::softmax_cross_entropy, sync);
        sync.wait();
      }
      got[ipc] = download(exec, model.gradients());
    }
    ::unsetenv("DTRAIN_DEVICE_IPC");
    ::unsetenv("DTRAIN_MPI_GPU_AWARE");
  }
  MESSAGE("rank " << f.comm.rank() << " of " << p << ": device IPC and staged gradients "
                  << std::string(test::same_bits(got[1], got[0]) ? "bit-equal" : "differ"));
  CHECK(test::same_bits(got[1], want));
  CHECK(test::same_bits(got[1], got[0]));
}

TEST_CASE("fully sharded on the device: the replicated run's bits, and the host's values") {
  Fixture f;
  Exec exec;
  StateParts whole_parts, parts;
  bool staged_replicated = false, staged_sharded = false;
  const std::vector<float> whole = train(f.comm, exec, false, whole_parts, staged_replicated);
  const std::vector<float> mine = train(f.comm, exec, true, parts, staged_sharded);
  CHECK(test::same_bits(test::pick(whole, parts), mine));
  MESSAGE("rank " << f.comm.rank() << ": fully sharded units "
                  << std::string(staged_sharded ? "staged through host memory"
                                                : "handed over on the device"));
  const std::vector<float> host = train_host(f.comm);
  REQUIRE(host.size() == whole.size());
  double worst = 0;
  for (std::size_t i = 0; i < host.size(); ++i)
    worst = std::max(
        worst, std::abs(double(whole[i]) - host[i]) / std::max(1.0, std::abs(double(host[i]))));
  MESSAGE("rank " << f.comm.rank() << ": replicated device vs host parameters, max relative "
                  << "difference " << worst << " after 3 steps");
  CHECK(worst < 1e-4);
}

}  // namespace dtrain_test_mpi_gpu_test
