// Checkpoints of fully sharded training (FullyShardedSync) over thread ranks: each rank saves
// its parts of the parameters and of AdamW's moments into the datasets a replicated run writes,
// so a replicated run resumes from a fully sharded run's file and the reverse, bit for bit in
// reproducible mode, and a fully sharded run on another number of ranks reads it too, a model
// built with deferred arenas (whose whole arenas never exist) as well; with checkpoint levels each
// rank's node-local part file, its partner's copy and the shared level's file restore too.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
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
#include <dtrain/transports/loopback.hpp>

#include "../support/fully_sharded.hpp"
#include "ckpt/parts_state.hpp"

namespace dtrain_test_ckpt_fully_sharded {

using namespace dtrain;
using test::pick;
using test::same_bits;
namespace fs = std::filesystem;
using LoopComm = Communicator<LoopbackTransport>;

namespace {

constexpr std::int64_t rows = 4;

std::vector<Sequential::entry_type> layers() {
  return {Linear(5, 16), Tanh(), LayerNorm(16), Linear(16, 9), Relu(), Linear(9, 2)};
}

struct Outcome {
  std::vector<float> params;  // whole (replicated) or this rank's parts (sharded)
  StateParts parts;
  std::optional<std::int64_t> restored;
  CheckpointLevel level = CheckpointLevel::none;
};

// With `local_base`: checkpoint levels, `per_node` ranks a node (consecutive ranks) with its
// node-local directory under it (node-local, partner and shared every save).
CheckpointOptions options(RestoreStrategy restore, const std::string& local_base, int rank,
                          int per_node = 1) {
  CheckpointOptions co;
  co.read_env = false;
  co.restore = restore;
  if (!local_base.empty()) {
    co.levels.local_dir = local_base + "/node" + std::to_string(rank / per_node);
    co.levels.node = rank / per_node;
    co.levels.local_every = 1;
    co.levels.shared_every = 1;
    co.levels.transfer_timeout_seconds = 30;
  }
  return co;
}

// Steps [first, 6] of a run on `p` ranks, fully sharded or not (with `deferred`, the model built
// with deferred arenas); restores from `from` first when given, saves after step 3 into `to` when
// given.
std::vector<Outcome> run(int p, bool sharded, const std::string& from, const std::string& to,
                         RestoreStrategy restore = RestoreStrategy::rank0, bool deferred = false,
                         const std::string& local_base = "", int per_node = 1) {
  std::vector<Outcome> out(static_cast<std::size_t>(p));
  run_loopback(p, [&](LoopbackTransport& t) {
    CommConfig c;
    c.reproducible = true;
    c.timeout_s = 60;
    LoopComm comm(t, c);
    Outcome& o = out[static_cast<std::size_t>(t.rank())];
    std::unique_ptr<Sequential> model_p =
        deferred ? std::make_unique<Sequential>(layers(), default_allocator(), deferred_arenas)
                 : std::make_unique<Sequential>(layers());
    Sequential& model = *model_p;
    if (!deferred) model.init(5);
    std::unique_ptr<FullyShardedSync<Sequential>> fsync;
    std::unique_ptr<GradientSync> sync;
    if (sharded)
      fsync = std::make_unique<FullyShardedSync<Sequential>>(comm, model);
    else
      sync = std::make_unique<GradientSync>(comm, model.gradients(), 512);
    if (deferred) model.init(5);
    AdamW opt(model, Schedule::constant(0.02));
    std::int64_t step = 0;
    if (!from.empty()) {
      Checkpointer<LoopComm> in(comm, from, options(restore, local_base, t.rank(), per_node));
      o.restored = in.restore_latest(named("model", model), named("optimizer", opt));
      o.level = in.restored_level();
      step = o.restored.value_or(0);
    }
    std::unique_ptr<Checkpointer<LoopComm>> ckpt;
    if (!to.empty())
      ckpt = std::make_unique<Checkpointer<LoopComm>>(
          comm, to, options(RestoreStrategy::rank0, local_base, t.rank(), per_node));
    std::vector<float> x(rows * 5), y(rows * 2);
    for (; step < 6; ++step) {
      const std::uint64_t seed = static_cast<std::uint64_t>(t.rank() * 100 + step);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = test::hashed_value(seed, i);
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = test::hashed_value(seed + 50, i);
      test::fully_sharded_or_replicated_step(model, x.data(), y.data(), rows, Loss::mse,
                                             fsync.get(), sync.get(), opt);
      if (ckpt && step + 1 == 3) {
        ckpt->save(3, named("model", model), named("optimizer", opt));
        ckpt->wait();  // the flush to the shared level, with levels
      }
    }
    const auto v = model.parameter_span();
    o.params.assign(v.begin(), v.end());
    o.parts = model.arena_parts();
  });
  return out;
}

}  // namespace

TEST_CASE("fully sharded checkpoints: replicated and fully sharded runs resume from each other") {
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_fsdp_" + std::to_string(::getpid()))).string();
  const std::string sharded_dir = base + "_sharded", plain_dir = base + "_plain";
  for (const auto& d : {sharded_dir, plain_dir}) fs::remove_all(d);

  const auto plain = run(2, false, "", plain_dir);     // replicated, saves at 3
  const auto sharded = run(2, true, "", sharded_dir);  // fully sharded, saves at 3
  for (int r = 0; r < 2; ++r)
    CHECK(same_bits(pick(plain[0].params, sharded[static_cast<std::size_t>(r)].parts),
                    sharded[static_cast<std::size_t>(r)].params));

  // Replicated from the fully sharded run's file, either restore strategy.
  for (auto restore : {RestoreStrategy::rank0, RestoreStrategy::distributed}) {
    const auto resumed = run(2, false, sharded_dir, "", restore);
    for (const auto& o : resumed) {
      CHECK(o.restored == std::optional<std::int64_t>(3));
      CHECK(same_bits(o.params, plain[0].params));
    }
  }
  // Fully sharded from the replicated run's file.
  const auto back = run(2, true, plain_dir, "");
  for (const auto& o : back) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(same_bits(o.params, pick(plain[0].params, o.parts)));
  }
  // Another world size reads the same file: 3 fully sharded ranks continue from the 2-rank
  // file as 3 replicated ranks do.
  const auto three_plain = run(3, false, sharded_dir, "");
  const auto three_sharded = run(3, true, sharded_dir, "");
  for (const auto& o : three_sharded)
    CHECK(same_bits(o.params, pick(three_plain[0].params, o.parts)));
  // A model built with deferred arenas: the same steps from scratch, and the same resumption.
  const auto lean = run(2, true, "", "", RestoreStrategy::rank0, true);
  for (const auto& o : lean) CHECK(same_bits(o.params, pick(plain[0].params, o.parts)));
  const auto lean_three = run(3, true, sharded_dir, "", RestoreStrategy::rank0, true);
  for (const auto& o : lean_three) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(same_bits(o.params, pick(three_plain[0].params, o.parts)));
  }
  for (const auto& d : {sharded_dir, plain_dir}) fs::remove_all(d);
}

TEST_CASE("fully sharded checkpoints with levels: per-rank node-local parts, partner and shared") {
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_fsdp_levels_" + std::to_string(::getpid())))
          .string();
  const std::string dir = base + "/run", local = base + "/local";
  fs::remove_all(base);
  auto part = [&](int node, int rank) {
    return local + "/node" + std::to_string(node) + "/ckpt-000000000003.rank" +
           std::to_string(rank) + "-of-4.h5";
  };
  // 4 ranks as 2 nodes of 2: every rank writes its own part file on its node and sends it to the
  // rank of the same place on the other node; the one-file checkpoint goes to the run directory.
  const auto plain = run(4, false, "", "");
  const auto saved = run(4, true, "", dir, RestoreStrategy::rank0, true, local, 2);
  for (const auto& o : saved) CHECK(same_bits(o.params, pick(plain[0].params, o.parts)));
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(fs::exists(part(r / 2, r)));      // its own
    CHECK(fs::exists(part(1 - r / 2, r)));  // the partner's copy
  }
  CHECK(fs::exists(dir + "/ckpt-000000000003.h5"));
  CHECK_FALSE(fs::exists(local + "/node0/ckpt-000000000003.h5"));  // no one-file copy
  // Each rank's part file holds its parts only, and says which: h5 reads them back.
  {
    const auto m = Hdf5Format::read(part(0, 1));
    std::int64_t rank = -1, held = 0;
    for (const auto& e : m.entries) {
      if (e.path == "/held_parts/rank") rank = e.i64;
      if (e.path.rfind("/model/", 0) == 0 && e.kind == detail::EntryKind::tensor)
        held += e.shape[0];
    }
    CHECK(rank == 1);
    CHECK(held == static_cast<std::int64_t>(saved[1].params.size()));
  }
  const auto local_back = run(4, true, dir, "", RestoreStrategy::rank0, true, local, 2);
  for (const auto& o : local_back) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(o.level == CheckpointLevel::local);
    CHECK(same_bits(o.params, pick(plain[0].params, o.parts)));
  }
  // A replicated run on the same ranks loads the tensors whole from the part files (each part
  // broadcast from the rank whose file holds it).
  const auto whole_back = run(4, false, dir, "", RestoreStrategy::rank0, false, local, 2);
  for (const auto& o : whole_back) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(o.level == CheckpointLevel::local);
    CHECK(same_bits(o.params, plain[0].params));
  }
  // Node 0's directory lost: its ranks' parts come back from node 1's copies, bit for bit.
  fs::remove_all(local + "/node0");
  const auto partner_back = run(4, true, dir, "", RestoreStrategy::rank0, true, local, 2);
  for (const auto& o : partner_back) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(o.level == CheckpointLevel::partner);
    CHECK(same_bits(o.params, pick(plain[0].params, o.parts)));
  }
  CHECK(fs::exists(part(0, 0)));  // rebuilt on node 0
  // Rank 1's own part file damaged: set aside, and its copy on node 1 taken instead (node 0's
  // copies of ranks 2 and 3 went with its directory: a restore does not rebuild them).
  fs::resize_file(part(0, 1), fs::file_size(part(0, 1)) / 2);
  const auto damaged_back = run(4, true, dir, "", RestoreStrategy::rank0, true, local, 2);
  for (const auto& o : damaged_back) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(o.level == CheckpointLevel::partner);
    CHECK(same_bits(o.params, pick(plain[0].params, o.parts)));
  }
  CHECK(fs::exists(part(0, 1) + ".damaged"));
  // Another world size: the shared level's file, each rank loading only its parts (levels on,
  // 2 ranks as 2 nodes: the 4-rank part files are not theirs).
  const auto two_plain = run(2, false, dir, "");
  const auto two = run(2, true, dir, "", RestoreStrategy::rank0, true, local);
  for (const auto& o : two) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(o.level == CheckpointLevel::shared);
    CHECK(same_bits(o.params, pick(two_plain[0].params, o.parts)));
  }
  const auto three_plain = run(3, false, dir, "");
  const auto three = run(3, true, dir, "", RestoreStrategy::distributed, true);
  for (const auto& o : three) {
    CHECK(o.restored == std::optional<std::int64_t>(3));
    CHECK(same_bits(o.params, pick(three_plain[0].params, o.parts)));
  }
  // Another run on the same node-local directories refuses their part files (run identity).
  const auto other = run(4, true, base + "/other", "", RestoreStrategy::rank0, true, local, 2);
  for (const auto& o : other) CHECK_FALSE(o.restored.has_value());
  CHECK(fs::exists(part(0, 0) + ".stale"));
  fs::remove_all(base);
}

TEST_CASE("node-local part files of another split of the parts give way to the shared level") {
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_fsdp_split_" + std::to_string(::getpid())))
          .string();
  const std::string dir = base + "/run", local = base + "/local";
  fs::remove_all(base);
  constexpr std::size_t n = 1000;
  std::vector<std::optional<std::int64_t>> got(2);
  std::vector<CheckpointLevel> level(2);
  std::vector<std::size_t> wrong(2, 0);
  run_loopback(2, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    LoopComm comm(t, c);
    const CheckpointOptions o = options(RestoreStrategy::rank0, local, t.rank());
    test::PartsState saved(n, test::PartsLayout::blocks, t.rank(), 2);
    Checkpointer<LoopComm>(comm, dir, o).save(7, named("s", saved));
    // Held as pieces dealt round robin now: the check pass refuses the part files (blocks).
    test::PartsState other(n, test::PartsLayout::round_robin, t.rank(), 2);
    Checkpointer<LoopComm> in(comm, dir, o);
    const auto r = static_cast<std::size_t>(t.rank());
    got[r] = in.restore_latest(named("s", other));
    level[r] = in.restored_level();
    const auto* w = static_cast<const float*>(other.whole.raw());
    for (std::size_t i = 0; i < n; ++i) wrong[r] += w[i] != test::parts_value(i) ? 1 : 0;
  });
  CHECK(fs::exists(local + "/node1/ckpt-000000000007.rank1-of-2.h5"));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<std::size_t>(r)] == std::optional<std::int64_t>(7));
    CHECK(level[static_cast<std::size_t>(r)] == CheckpointLevel::shared);
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
  }
  fs::remove_all(base);
}

TEST_CASE(
    "node-local part files of steps a rollback removed from the run directory are set aside") {
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_fsdp_rollback_" + std::to_string(::getpid())))
          .string();
  const std::string dir = base + "/run", local = base + "/local";
  fs::remove_all(base);
  constexpr std::size_t n = 600;
  std::vector<std::optional<std::int64_t>> got(2);
  std::vector<CheckpointLevel> level(2);
  run_loopback(2, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    LoopComm comm(t, c);
    const CheckpointOptions o = options(RestoreStrategy::rank0, local, t.rank());
    test::PartsState s(n, test::PartsLayout::blocks, t.rank(), 2);
    {
      Checkpointer<LoopComm> ck(comm, dir, o);
      ck.save(3, named("s", s));
      ck.save(6, named("s", s));
    }
    comm.barrier();
    if (t.rank() == 0) fs::remove(dir + "/ckpt-000000000006.h5");  // the rollback
    comm.barrier();
    Checkpointer<LoopComm> in(comm, dir, o);
    const auto r = static_cast<std::size_t>(t.rank());
    got[r] = in.restore_latest(named("s", s));
    level[r] = in.restored_level();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<std::size_t>(r)] == std::optional<std::int64_t>(3));
    CHECK(level[static_cast<std::size_t>(r)] == CheckpointLevel::local);
    for (int node = 0; node < 2; ++node) {
      const std::string f = local + "/node" + std::to_string(node) + "/ckpt-000000000006.rank" +
                            std::to_string(r) + "-of-2.h5";
      CHECK_FALSE(fs::exists(f));
      CHECK(fs::exists(f + ".stale"));
    }
  }
  fs::remove_all(base);
}

}  // namespace dtrain_test_ckpt_fully_sharded
