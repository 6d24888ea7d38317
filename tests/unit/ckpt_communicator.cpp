// The Checkpointer with the library's own Communicator over the loopback transport (the unit
// tests elsewhere use a minimal stand-in communicator): bit-exact resume over 1-3 ranks, and with
// GradientSync's sharded steps (a partial optimizer state refused, gathered, resumed).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <vector>
#include <string>
#include <type_traits>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/optim/sgd.hpp>
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

namespace {
// Parameters as a checkpointed object.
struct Params {
  dtrain::Tensor w;
  template <class V>
  void visit_state(V& v) {
    v.tensor("w", w.view(), w.shape());
  }
};
}  // namespace

TEST_CASE("sharded steps: the checkpoint refuses a partial optimizer state, resumes after gather") {
  const std::string dir =
      (fs::temp_directory_path() / ("dtrain_ckpt_sharded_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const std::size_t n = 3001;
  std::vector<std::vector<float>> plain_w(2), resumed_w(2);
  // 6 SGD steps (momentum) of rank-specific gradients; sharded runs save at step 3 and resume.
  auto run = [&](dtrain::LoopbackTransport& t, bool sharded, bool resume,
                 std::vector<std::vector<float>>& out) {
    LoopComm comm(t);
    const int r = comm.rank();
    Params p{dtrain::Tensor({static_cast<std::int64_t>(n)}, dtrain::DType::f32)};
    std::vector<float> g(n);
    auto* w = static_cast<float*>(p.w.raw());
    for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<float>(i % 17) * 0.125f;
    const dtrain::BufferView pv = p.w.view(), gv{dtrain::span<float>(g)};
    dtrain::GradientSync sync(comm, gv, 4096);
    if (sharded) sync.shard_updates(pv);
    dtrain::SgdOptions so;
    so.momentum = 0.9;
    dtrain::Sgd opt(pv, gv, dtrain::Schedule::constant(0.05), so);
    dtrain::Checkpointer<LoopComm> ckpt(comm, dir);
    int first = 1;
    if (resume) {
      REQUIRE(ckpt.restore_latest(dtrain::named("params", p), dtrain::named("optimizer", opt)) ==
              std::optional<std::int64_t>(3));
      first = 4;
    }
    for (int s = first; s <= 6; ++s) {
      for (std::size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 5 + s) % 23) / 23.0f;
      sync.ready_all();
      sync.wait(opt);
      if (sharded && !resume && s == 3) {
        // Not yet gathered: every rank refuses, and no checkpoint appears.
        CHECK_THROWS_AS(ckpt.save(3, dtrain::named("params", p), dtrain::named("optimizer", opt)),
                        dtrain::InvalidArgument);
        CHECK_FALSE(ckpt.last_step().has_value());
        std::size_t files = 0;
        for (const auto& e : fs::recursive_directory_iterator(dir))
          files += e.is_regular_file() && e.path().extension() == ".h5";
        CHECK(files == 0u);
        sync.gather_state(opt);
        ckpt.save(3, dtrain::named("params", p), dtrain::named("optimizer", opt));
      }
    }
    out[static_cast<std::size_t>(r)].assign(w, w + n);
  };
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) {
    std::vector<std::vector<float>> ignored(2);
    run(t, true, false, ignored);  // saves at step 3
  });
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) { run(t, false, false, plain_w); });
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) { run(t, true, true, resumed_w); });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(resumed_w[static_cast<std::size_t>(r)] == plain_w[0]);
  }
  CHECK(plain_w[0][5] != 5 * 0.125f);  // trained
  fs::remove_all(dir);
}
