// The Checkpointer with the library's own Communicator over MpiTransport: the parallel HDF5
// strategies find the MPI communicator through comm.transport().mpi_comm().
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
