// Checkpoints of fully sharded training on real MPI (mpiexec -n 2, 3), with every write strategy
// (rank 0 assembling the parts, MPI-IO with one writer, MPI-IO with disjoint slices): a
// replicated run resumes from a fully sharded run's file and the reverse, and both end with the
// bits of an uninterrupted replicated run (reproducible mode).
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>

#include "../support/fully_sharded.hpp"

namespace dtrain_test_ckpt_fully_sharded_mpi {

using namespace dtrain;
using test::pick;
using test::same_bits;
namespace fs = std::filesystem;
using MpiComm = Communicator<MpiTransport>;

namespace {

std::string shared_dir(MpiComm& comm, const std::string& tag) {
  char buf[256] = {};
  if (comm.rank() == 0)
    std::snprintf(buf, sizeof buf, "%s/dtrain_ckpt_fsdp_%s_%d", fs::temp_directory_path().c_str(),
                  tag.c_str(), static_cast<int>(::getpid()));
  comm.broadcast(BufferView(buf, sizeof buf / 8, DType::i64), 0);
  return buf;
}

// Steps up to 5, fully sharded or not; restores from `from` first when given, saves after step
// 2 into `to` when given. Returns the parameters held (whole, or this rank's parts) and sets
// `parts`.
std::vector<float> run(MpiComm& comm, bool sharded, CheckpointStrategy strategy,
                       const std::string& from, const std::string& to, StateParts& parts) {
  Sequential model({Linear(7, 20), Tanh(), LayerNorm(20), Linear(20, 3)});
  model.init(4);
  std::unique_ptr<FullyShardedSync<Sequential>> fsync;
  std::unique_ptr<GradientSync> sync;
  if (sharded)
    fsync = std::make_unique<FullyShardedSync<Sequential>>(comm, model);
  else
    sync = std::make_unique<GradientSync>(comm, model.gradients(), 512);
  AdamW opt(model, Schedule::constant(0.02));
  CheckpointOptions co;
  co.strategy = strategy;
  std::int64_t step = 0;
  if (!from.empty()) {
    Checkpointer<MpiComm> in(comm, from, co);
    const auto got = in.restore_latest(named("model", model), named("optimizer", opt));
    REQUIRE(got == std::optional<std::int64_t>(2));
    step = *got;
  }
  std::unique_ptr<Checkpointer<MpiComm>> out;
  if (!to.empty()) out = std::make_unique<Checkpointer<MpiComm>>(comm, to, co);
  const std::int64_t rows = 4;
  std::vector<float> x(rows * 7), y(rows * 3);
  for (; step < 5; ++step) {
    const std::uint64_t seed = static_cast<std::uint64_t>(comm.rank() * 100 + step);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = test::hashed_value(seed, i);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = test::hashed_value(seed + 50, i);
    test::fully_sharded_or_replicated_step(model, x.data(), y.data(), rows, Loss::mse, fsync.get(),
                                           sync.get(), opt);
    if (out && step + 1 == 2) out->save(2, named("model", model), named("optimizer", opt));
  }
  parts = model.arena_parts();
  const auto v = model.parameter_span();
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("fully sharded checkpoints on MPI: every write strategy, resumed across modes") {
  MpiTransport transport(MPI_COMM_WORLD);
  CommConfig c;
  c.reproducible = true;
  c.timeout_s = 60;
  MpiComm comm(transport, c);
  StateParts none, parts;
  const std::vector<float> ref = run(comm, false, CheckpointStrategy::rank0, "", "", none);
  for (auto strategy : {CheckpointStrategy::rank0, CheckpointStrategy::parallel_rank0,
                        CheckpointStrategy::parallel_slices}) {
    CAPTURE(name_of(strategy));
    const std::string sharded_dir = shared_dir(comm, std::string("s_") + name_of(strategy));
    const std::string plain_dir = shared_dir(comm, std::string("p_") + name_of(strategy));
    const auto mine = run(comm, true, strategy, "", sharded_dir, parts);
    CHECK(same_bits(mine, pick(ref, parts)));
    CHECK(same_bits(run(comm, false, strategy, sharded_dir, "", none), ref));
    run(comm, false, strategy, "", plain_dir, none);
    const auto back = run(comm, true, strategy, plain_dir, "", parts);
    CHECK(same_bits(back, pick(ref, parts)));
    comm.barrier();
    if (comm.rank() == 0) {
      fs::remove_all(sharded_dir);
      fs::remove_all(plain_dir);
    }
  }
}

}  // namespace dtrain_test_ckpt_fully_sharded_mpi
