// The Checkpointer with the library's own Communicator over MpiTransport: the parallel HDF5
// strategies find the MPI communicator through comm.transport().mpi_comm(); tensors held in parts
// over the ranks are written with every strategy (by the parallel ones in place).
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

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_ckpt_mpi_communicator {

namespace fs = std::filesystem;
using MpiComm = dtrain::Communicator<dtrain::MpiTransport>;

namespace {

// A run directory under the temporary folder named after rank 0's process and `tag`, the same
// on every rank.
std::string shared_dir(MpiComm& comm, const std::string& tag) {
  char buf[256] = {};
  if (comm.rank() == 0)
    std::snprintf(buf, sizeof buf, "%s/dtrain_ckpt_%s_%d", fs::temp_directory_path().c_str(),
                  tag.c_str(), static_cast<int>(::getpid()));
  comm.broadcast(dtrain::BufferView(buf, sizeof buf / 8, dtrain::DType::i64), 0);
  return buf;
}

}  // namespace

TEST_CASE("bit-exact resume through Communicator<MpiTransport> with every strategy") {
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  for (auto strategy :
       {dtrain::CheckpointStrategy::rank0, dtrain::CheckpointStrategy::parallel_rank0,
        dtrain::CheckpointStrategy::parallel_slices}) {
    CAPTURE(dtrain::name_of(strategy));
    const std::string dir = shared_dir(comm, std::string("mpicomm_") + dtrain::name_of(strategy));
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

TEST_CASE("tensors held in parts over MPI ranks: the whole tensor's dataset, written in place") {
  // rank0 assembles the parts on rank 0; the parallel strategies have every rank write its own
  // parts into the dataset (runs of elements across the rows of 2-d and 3-d tensors), so no rank
  // keeps an assembled copy. The file must hold the whole tensor either way, restorable whole.
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  const std::size_t n = 5000;
  for (auto strategy :
       {dtrain::CheckpointStrategy::rank0, dtrain::CheckpointStrategy::parallel_rank0,
        dtrain::CheckpointStrategy::parallel_slices}) {
    for (auto layout :
         {dtrain::test::PartsLayout::blocks, dtrain::test::PartsLayout::round_robin}) {
      for (const dtrain::Shape& shape :
           {dtrain::Shape{5000}, dtrain::Shape{50, 100}, dtrain::Shape{10, 20, 25}}) {
        CAPTURE(dtrain::name_of(strategy));
        CAPTURE(static_cast<int>(layout));
        CAPTURE(shape.size());
        const std::string dir =
            shared_dir(comm, std::string("mpiparts_") + dtrain::name_of(strategy));
        dtrain::CheckpointOptions o;
        o.strategy = strategy;
        {
          dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
          dtrain::test::PartsState ps(n, layout, comm.rank(), comm.size(), shape);
          dtrain::test::FakeRun run(comm.rank());
          ckpt.save(1, dtrain::named("model", run.model), dtrain::named("parts", ps),
                    dtrain::per_rank("sampler", run.sampler));
          // What a rank keeps after a synchronous save (keep_buffers is on): nothing, with either
          // strategy (rank0 streams the parts into the file piece by piece, never assembling the
          // tensor).
          CHECK(ckpt.buffer_bytes() == 0u);
        }
        if (comm.rank() == 0)
          CHECK(dtrain::test::parts_file_difference(
                    dtrain::Hdf5Format::read(dir + "/ckpt-000000000001.h5"), "/parts/w", n,
                    shape) == "");
        dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
        dtrain::test::PartsState back(n, layout, comm.rank(), comm.size(), shape);
        REQUIRE(ckpt.restore_latest(dtrain::named("parts", back)) ==
                std::optional<std::int64_t>(1));
        std::size_t wrong = 0;
        const auto* f = static_cast<const float*>(back.whole.raw());
        for (std::size_t i = 0; i < n; ++i) wrong += f[i] != dtrain::test::parts_value(i);
        CHECK(wrong == 0u);
        comm.barrier();
        if (comm.rank() == 0) fs::remove_all(dir);
      }
    }
  }
}

TEST_CASE("tensors held in parts, parallel write: a gap or an overlap is refused on every rank") {
  // The parallel strategies check the ranks' lists of parts on every rank before anything is
  // written: each rank throws the same error and no file is published.
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  MpiComm comm(transport);
  if (comm.size() < 2) return;  // a gap or overlap needs two ranks' parts
  using dtrain::test::PartsLayout;
  const std::size_t n = 600;
  for (auto strategy :
       {dtrain::CheckpointStrategy::parallel_rank0, dtrain::CheckpointStrategy::parallel_slices}) {
    for (PartsLayout layout : {PartsLayout::overlap, PartsLayout::gap}) {
      CAPTURE(dtrain::name_of(strategy));
      CAPTURE(static_cast<int>(layout));
      const std::string dir = shared_dir(comm, "mpiparts_bad");
      dtrain::CheckpointOptions o;
      o.strategy = strategy;
      dtrain::Checkpointer<MpiComm> ckpt(comm, dir, o);
      dtrain::test::PartsState ps(n, layout, comm.rank(), comm.size(), dtrain::Shape{20, 30});
      CHECK(dtrain::test::parts_refusal_problem(ckpt, ps, layout) == "");
      // The same Checkpointer writes good parts afterwards: one file, the whole tensor.
      dtrain::test::PartsState good(n, PartsLayout::blocks, comm.rank(), comm.size(),
                                    dtrain::Shape{20, 30});
      ckpt.save(2, dtrain::named("parts", good));
      comm.barrier();
      if (comm.rank() == 0) {
        std::size_t files = 0;
        for (const auto& e : fs::recursive_directory_iterator(dir))
          files += e.is_regular_file() && e.path().extension() == ".h5";
        CHECK(files == 1u);
        CHECK(dtrain::test::parts_file_difference(
                  dtrain::Hdf5Format::read(dir + "/ckpt-000000000002.h5"), "/parts/w", n,
                  dtrain::Shape{20, 30}) == "");
        fs::remove_all(dir);
      }
      comm.barrier();
    }
  }
}

}  // namespace dtrain_test_ckpt_mpi_communicator
