// The Checkpointer with the library's own Communicator over the loopback transport (the unit
// tests elsewhere use a minimal stand-in communicator): bit-exact resume over 1-3 ranks.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <type_traits>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

#include "ckpt/fake_state.hpp"

namespace fs = std::filesystem;
using LoopComm = dtrain::Communicator<dtrain::LoopbackTransport>;

TEST_CASE("bit-exact resume through Communicator<LoopbackTransport>") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    const std::string dir =
        (fs::temp_directory_path() /
         ("dtrain_ckpt_loopcomm_" + std::to_string(::getpid()) + "_" + std::to_string(n)))
            .string();
    fs::remove_all(dir);
    dtrain::run_loopback(n, [&](dtrain::LoopbackTransport& t) {
      LoopComm comm(t);
      auto objects = [](dtrain::test::FakeRun& r) {
        return std::make_tuple(dtrain::named("model", r.model), dtrain::named("optimizer", r.opt),
                               dtrain::per_rank("sampler", r.sampler),
                               dtrain::named("dropout", r.dropout),
                               dtrain::named("schedule", r.sched));
      };
      dtrain::test::FakeRun ref(comm.rank());
      for (int s = 1; s <= 6; ++s) ref.step(comm);
      {
        dtrain::CheckpointOptions o;
        o.every_steps = 3;
        dtrain::Checkpointer<LoopComm> ckpt(comm, dir, o);
        dtrain::test::FakeRun run(comm.rank());
        for (std::int64_t s = 1; s <= 4; ++s) {
          run.step(comm);
          std::apply([&](auto&&... o) { ckpt.maybe_save(s, o...); }, objects(run));
        }
      }
      dtrain::Checkpointer ckpt(comm, dir);  // class template argument deduction
      static_assert(std::is_same_v<decltype(ckpt), dtrain::Checkpointer<LoopComm>>);
      dtrain::test::FakeRun resumed(comm.rank());
      auto step =
          std::apply([&](auto&&... o) { return ckpt.restore_latest(o...); }, objects(resumed));
      REQUIRE(step == std::optional<std::int64_t>(3));
      for (int s = 4; s <= 6; ++s) resumed.step(comm);
      CHECK(dtrain::test::first_difference(ref, resumed) == "");
    });
    fs::remove_all(dir);
  }
}
