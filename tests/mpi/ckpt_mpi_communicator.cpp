// The Checkpointer with the library's own Communicator over MpiTransport: the parallel HDF5
// strategies find the MPI communicator through comm.transport().mpi_comm(); tensors held in parts
// over the ranks are written with every strategy.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/parts_state.hpp"

namespace fs = std::filesystem;
using MpiComm = dtrain::Communicator<dtrain::MpiTransport>;

TEST_CASE("bit-exact resume through Communicator<MpiTransport> with every strategy") {
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  for (auto strategy :
       {dtrain::CheckpointStrategy::rank0, dtrain::CheckpointStrategy::parallel_rank0,
        dtrain::CheckpointStrategy::parallel_slices}) {
    CAPTURE(dtrain::name_of(strategy));
    char buf[256] = {};
    if (comm.rank() == 0)
      std::snprintf(buf, sizeof buf, "%s/dtrain_ckpt_mpicomm_%d_%s",
                    fs::temp_directory_path().c_str(), static_cast<int>(::getpid()),
                    dtrain::name_of(strategy));
    comm.broadcast(dtrain::BufferView(buf, sizeof buf / 8, dtrain::DType::i64), 0);
    const std::string dir = buf;
    auto objects = [](dtrain::test::FakeRun& r) {
      return std::make_tuple(dtrain::named("model", r.model), dtrain::named("optimizer", r.opt),
                             dtrain::per_rank("sampler", r.sampler),
                             dtrain::named("dropout", r.dropout),
                             dtrain::named("schedule", r.sched));
    };
    dtrain::CheckpointOptions o;
    o.strategy = strategy;
    dtrain::test::FakeRun ref(comm.rank());
    for (int s = 1; s <= 5; ++s) ref.step(comm);
    {
      dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
      dtrain::test::FakeRun run(comm.rank());
      for (int s = 1; s <= 3; ++s) run.step(comm);
      std::apply([&](auto&&... x) { ckpt.save(3, x...); }, objects(run));
    }
    dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
    dtrain::test::FakeRun resumed(comm.rank());
    auto step =
        std::apply([&](auto&&... x) { return ckpt.restore_latest(x...); }, objects(resumed));
    REQUIRE(step == std::optional<std::int64_t>(3));
    for (int s = 4; s <= 5; ++s) resumed.step(comm);
    CHECK(dtrain::test::first_difference(ref, resumed) == "");
    comm.barrier();
    if (comm.rank() == 0) fs::remove_all(dir);
  }
}

TEST_CASE("tensors held in parts over MPI ranks: assembled into the whole tensor's dataset") {
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  const std::size_t n = 5000;
  for (auto strategy :
       {dtrain::CheckpointStrategy::rank0, dtrain::CheckpointStrategy::parallel_rank0,
        dtrain::CheckpointStrategy::parallel_slices}) {
    for (auto layout :
         {dtrain::test::PartsLayout::blocks, dtrain::test::PartsLayout::round_robin}) {
      CAPTURE(dtrain::name_of(strategy));
      CAPTURE(static_cast<int>(layout));
      char buf[256] = {};
      if (comm.rank() == 0)
        std::snprintf(buf, sizeof buf, "%s/dtrain_ckpt_mpiparts_%d_%s",
                      fs::temp_directory_path().c_str(), static_cast<int>(::getpid()),
                      dtrain::name_of(strategy));
      comm.broadcast(dtrain::BufferView(buf, sizeof buf / 8, dtrain::DType::i64), 0);
      const std::string dir = buf;
      dtrain::CheckpointOptions o;
      o.strategy = strategy;
      {
        dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
        dtrain::test::PartsState ps(n, layout, comm.rank(), comm.size());
        dtrain::test::FakeRun run(comm.rank());
        ckpt.save(1, dtrain::named("model", run.model), dtrain::named("parts", ps),
                  dtrain::per_rank("sampler", run.sampler));
      }
      if (comm.rank() == 0)
        CHECK(dtrain::test::parts_file_difference(
                  dtrain::Hdf5Format::read(dir + "/ckpt-000000000001.h5"), "/parts/w", n) == "");
      dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
      dtrain::test::PartsState back(n, layout, comm.rank(), comm.size());
      REQUIRE(ckpt.restore_latest(dtrain::named("parts", back)) == std::optional<std::int64_t>(1));
      std::size_t wrong = 0;
      const auto* f = static_cast<const float*>(back.whole.raw());
      for (std::size_t i = 0; i < n; ++i) wrong += f[i] != dtrain::test::parts_value(i);
      CHECK(wrong == 0u);
      comm.barrier();
      if (comm.rank() == 0) fs::remove_all(dir);
    }
  }
}
