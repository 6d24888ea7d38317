// The Checkpointer with the library's own Communicator over the loopback transport (the unit
// tests elsewhere use a minimal stand-in communicator): bit-exact resume over 1-3 ranks, with
// GradientSync's sharded steps (the state saved from its parts, the same file as the whole
// state's, resumed), tensors held in parts in several layouts (assembled, or refused), and the
// host buffers a save keeps (CheckpointOptions::keep_buffers), and a file that changes between its
// verification and the reads of a restore.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>
#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/optim/sgd.hpp>
#include <dtrain/transports/loopback.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/parts_state.hpp"

namespace fs = std::filesystem;
using LoopComm = dtrain::Communicator<dtrain::LoopbackTransport>;

namespace {
// Runs of at least 12 bytes for the duration of a test: a distributed restore then cuts every
// tensor of 24 bytes or more into runs read by different ranks.
struct SmallRuns {
  std::size_t saved = dtrain::detail::ckpt_run_bytes();
  SmallRuns() { dtrain::detail::ckpt_run_bytes() = 12; }
  ~SmallRuns() { dtrain::detail::ckpt_run_bytes() = saved; }
};
}  // namespace

TEST_CASE("bit-exact resume through Communicator<LoopbackTransport>, either restore strategy") {
  SmallRuns small;
  for (auto restore : {dtrain::RestoreStrategy::rank0, dtrain::RestoreStrategy::distributed})
    for (int n : {1, 2, 3}) {
      CAPTURE(n);
      CAPTURE(dtrain::name_of(restore));
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
        dtrain::CheckpointOptions ro;
        ro.restore = restore;
        dtrain::Checkpointer ckpt(comm, dir, ro);  // class template argument deduction
        static_assert(std::is_same_v<decltype(ckpt), dtrain::Checkpointer<LoopComm>>);
        CHECK(ckpt.restore_strategy() == restore);
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
// Two checkpoint files of a params/w and an optimizer/momentum tensor hold the same entries, and
// those tensors bit for bit.
void same_tensors(const std::string& first, const std::string& second) {
  const auto a = dtrain::Hdf5Format::read(first);
  const auto b = dtrain::Hdf5Format::read(second);
  REQUIRE(a.entries.size() == b.entries.size());
  std::size_t tensors = 0;
  for (std::size_t k = 0; k < a.entries.size(); ++k) {
    CAPTURE(a.entries[k].path);
    REQUIRE(a.entries[k].path == b.entries[k].path);
    if (a.entries[k].kind != dtrain::detail::EntryKind::tensor) continue;
    ++tensors;
    REQUIRE(a.entries[k].bytes() == b.entries[k].bytes());
    CHECK(std::memcmp(a.entries[k].data, b.entries[k].data, a.entries[k].bytes()) == 0);
    CHECK(a.entries[k].crc == b.entries[k].crc);
  }
  CHECK(tensors == 2u);  // params/w, optimizer/momentum
}

// Parameters as a checkpointed object.
struct Params {
  dtrain::Tensor w;
  template <class V>
  void visit_state(V& v) {
    v.tensor("w", w.view(), w.shape());
  }
};

// One rank's parameters (n floats, element i = (i % period) * scale, the same on every rank),
// their gradients, a GradientSync of 4 KiB buckets and SGD (momentum 0.9, lr 0.05) over them.
struct SgdRun {
  Params p;
  std::vector<float> g;
  dtrain::BufferView pv, gv;
  dtrain::GradientSync sync;
  dtrain::Sgd opt;
  SgdRun(LoopComm& comm, std::size_t n, std::size_t period, float scale)
      : p{dtrain::Tensor({static_cast<std::int64_t>(n)}, dtrain::DType::f32)},
        g(n),
        pv(p.w.view()),
        gv(dtrain::span<float>(g)),
        sync(comm, gv, 4096),
        opt(pv, gv, dtrain::Schedule::constant(0.05), momentum()) {
    for (std::size_t i = 0; i < n; ++i) w()[i] = static_cast<float>(i % period) * scale;
  }
  float* w() { return static_cast<float*>(p.w.raw()); }
  static dtrain::SgdOptions momentum() {
    dtrain::SgdOptions so;
    so.momentum = 0.9;
    return so;
  }
};
}  // namespace

TEST_CASE("sharded steps: the checkpoint saves the optimizer state from its parts, resumes") {
  SmallRuns small;
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_sharded_" + std::to_string(::getpid()))).string();
  const std::string sharded_dir = base + "_parts", plain_dir = base + "_whole",
                    refused_dir = base + "_refused", rollback_dir = base + "_rollback";
  for (const auto& d : {sharded_dir, plain_dir, refused_dir, rollback_dir}) fs::remove_all(d);
  const std::size_t n = 3001;
  std::vector<std::vector<float>> plain_w(2), resumed_w(2), resumed_sharded_w(2), rolled_w(2);
  // 6 SGD steps (momentum) of rank-specific gradients; the first two runs save at step 3, the
  // next two resume from the sharded run's file; the last saves at step 3 and after step 5 goes
  // back to it in the same process (restored into the sharded optimizer), then runs 4-6 again.
  enum class Mode { save_sharded, save_plain, resume, resume_sharded, rollback };
  auto run = [&](dtrain::LoopbackTransport& t, Mode mode, std::vector<std::vector<float>>& out) {
    LoopComm comm(t);
    const int r = comm.rank();
    const bool sharded =
        mode == Mode::save_sharded || mode == Mode::resume_sharded || mode == Mode::rollback;
    const bool resume = mode == Mode::resume || mode == Mode::resume_sharded;
    SgdRun run(comm, n, 17, 0.125f);
    Params& p = run.p;
    std::vector<float>& g = run.g;
    float* w = run.w();
    const dtrain::BufferView pv = run.pv;
    dtrain::GradientSync& sync = run.sync;
    dtrain::Sgd& opt = run.opt;
    // The sharded resume shards the state at once: the restore loads this rank's parts only.
    if (mode == Mode::resume_sharded)
      sync.shard_updates(pv, opt);
    else if (sharded)
      sync.shard_updates(pv);
    // The sharded runs restore with every rank reading its share of the file (in runs of 12
    // bytes and more: each moment is read by both ranks), the plain resume from rank 0.
    dtrain::CheckpointOptions co;
    co.restore = sharded ? dtrain::RestoreStrategy::distributed : dtrain::RestoreStrategy::rank0;
    dtrain::Checkpointer<LoopComm> ckpt(comm,
                                        mode == Mode::save_plain ? plain_dir
                                        : mode == Mode::rollback ? rollback_dir
                                                                 : sharded_dir,
                                        co);
    int first = 1;
    if (resume) {
      REQUIRE(ckpt.restore_latest(dtrain::named("params", p), dtrain::named("optimizer", opt)) ==
              std::optional<std::int64_t>(3));
      if (sharded) CHECK(opt.state_elements() < n);  // restored in parts
      first = 4;
    }
    bool rolled_back = false;
    for (int s = first; s <= 6; ++s) {
      for (std::size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 5 + s) % 23) / 23.0f;
      sync.ready_all();
      sync.wait(opt);
      if (mode == Mode::rollback) {
        if (s == 3) ckpt.save(3, dtrain::named("params", p), dtrain::named("optimizer", opt));
        if (s == 5 && !rolled_back) {
          const std::size_t kept = opt.state_elements();
          CHECK(kept < n);  // held in parts before the restore
          REQUIRE(
              ckpt.restore_latest(dtrain::named("params", p), dtrain::named("optimizer", opt)) ==
              std::optional<std::int64_t>(3));
          CHECK(opt.state_elements() == kept);  // and after it
          rolled_back = true;
          s = 3;
        }
        continue;
      }
      if (!resume && s == 3) {
        // Sharded: saved as it is, each rank's parts assembled on rank 0 (no gather_state).
        const std::size_t kept = opt.state_elements();
        ckpt.save(3, dtrain::named("params", p), dtrain::named("optimizer", opt));
        CHECK(opt.state_elements() == kept);  // still sharded
        if (sharded) {
          CHECK(kept < n);
          // A whole-sized state not gathered (only this rank's parts current) is refused on
          // every rank, and no file appears.
          opt.unshard_state();
          dtrain::Checkpointer<LoopComm> refused(comm, refused_dir);
          CHECK_THROWS_AS(
              refused.save(3, dtrain::named("params", p), dtrain::named("optimizer", opt)),
              dtrain::InvalidArgument);
          std::size_t files = 0;
          for (const auto& e : fs::recursive_directory_iterator(refused_dir))
            files += e.is_regular_file() && e.path().extension() == ".h5";
          CHECK(files == 0u);
        }
      }
    }
    out[static_cast<std::size_t>(r)].assign(w, w + n);
  };
  std::vector<std::vector<float>> ignored(2);
  dtrain::run_loopback(2,
                       [&](dtrain::LoopbackTransport& t) { run(t, Mode::save_sharded, ignored); });
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) { run(t, Mode::save_plain, plain_w); });
  // The two files hold the same optimizer state, bit for bit.
  same_tensors(sharded_dir + "/ckpt-000000000003.h5", plain_dir + "/ckpt-000000000003.h5");
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) { run(t, Mode::resume, resumed_w); });
  dtrain::run_loopback(
      2, [&](dtrain::LoopbackTransport& t) { run(t, Mode::resume_sharded, resumed_sharded_w); });
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) { run(t, Mode::rollback, rolled_w); });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(resumed_w[static_cast<std::size_t>(r)] == plain_w[0]);
    CHECK(resumed_sharded_w[static_cast<std::size_t>(r)] == plain_w[0]);
    CHECK(rolled_w[static_cast<std::size_t>(r)] == plain_w[0]);
  }
  CHECK(plain_w[0][5] != 5 * 0.125f);  // trained
  for (const auto& d : {sharded_dir, plain_dir, refused_dir, rollback_dir}) fs::remove_all(d);
}

TEST_CASE(
    "tensors held in parts: one dataset, the whole tensor's, for every layout and rank count") {
  using dtrain::test::PartsLayout;
  // 1000 elements: small parts, moved together through the receivers' bounce buffers; 2.2M
  // (8.8 MB): parts of 4.4 MB, moved in place on rank 0 in two pieces each.
  for (std::size_t n : {std::size_t{1000}, std::size_t{2200000}}) {
    for (int p : {1, 2, 3}) {
      for (PartsLayout layout :
           {PartsLayout::blocks, PartsLayout::round_robin, PartsLayout::last_empty}) {
        if (layout == PartsLayout::last_empty && p == 1) continue;
        // The large tensor in two layouts: parts of 4.4 MB on 2 and 3 ranks (one empty).
        if (n > 1000 && !(p == 2 && layout == PartsLayout::blocks) &&
            !(p == 3 && layout == PartsLayout::last_empty))
          continue;
        for (bool async : {false, true}) {
          if (async && layout != PartsLayout::round_robin) continue;  // one layout is enough
          CAPTURE(n);
          CAPTURE(p);
          CAPTURE(static_cast<int>(layout));
          CAPTURE(async);
          const std::string dir =
              (fs::temp_directory_path() / ("dtrain_ckpt_parts_" + std::to_string(::getpid())))
                  .string();
          fs::remove_all(dir);
          dtrain::run_loopback(p, [&](dtrain::LoopbackTransport& t) {
            LoopComm comm(t);
            dtrain::CheckpointOptions o;
            o.async = async;
            {
              dtrain::Checkpointer<LoopComm> ckpt(comm, dir, o);
              dtrain::test::PartsState ps(n, layout, comm.rank(), p);
              // Twice: the second save reuses rank 0's assembly buffer.
              ckpt.save(1, dtrain::named("parts", ps));
              ckpt.save(2, dtrain::named("parts", ps));
              ckpt.wait();
            }
            if (comm.rank() == 0)
              for (const char* f : {"/ckpt-000000000001.h5", "/ckpt-000000000002.h5"}) {
                CAPTURE(f);
                CHECK(dtrain::test::parts_file_difference(dtrain::Hdf5Format::read(dir + f),
                                                          "/parts/w", n) == "");
              }
            // Restored whole on every rank.
            dtrain::Checkpointer<LoopComm> ckpt(comm, dir);
            dtrain::test::PartsState back(n, layout, comm.rank(), p);
            back.tag = 0;
            REQUIRE(ckpt.restore_latest(dtrain::named("parts", back)) ==
                    std::optional<std::int64_t>(2));
            const auto* f = static_cast<const float*>(back.whole.raw());
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < n; ++i) wrong += f[i] != dtrain::test::parts_value(i);
            CHECK(wrong == 0u);
            CHECK(back.tag == 40);
          });
          fs::remove_all(dir);
        }
      }
    }
  }
}

// The Checkpointer's required contract only (no allgather): the ranks' lists of parts then
// travel by one broadcast each, the path a user's own communicator takes.
struct BroadcastOnlyComm {
  LoopComm& c;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  void barrier() { c.barrier(); }
  void broadcast(dtrain::BufferView b, int root) { c.broadcast(b, root); }
  void allreduce(dtrain::BufferView b, dtrain::ReduceOp op) { c.allreduce(b, op); }
};

TEST_CASE("tensors held in parts: the same file through a communicator without allgather") {
  using dtrain::test::PartsLayout;
  static_assert(!dtrain::detail::ckpt_comm_has_allgather<BroadcastOnlyComm>::value);
  // Only the exchange of the lists differs from the case above (the bytes travel alike).
  const std::size_t n = 1000;
  for (PartsLayout layout : {PartsLayout::round_robin, PartsLayout::last_empty}) {
    CAPTURE(static_cast<int>(layout));
    const std::string dir =
        (fs::temp_directory_path() / ("dtrain_ckpt_parts_bc_" + std::to_string(::getpid())))
            .string();
    fs::remove_all(dir);
    dtrain::run_loopback(3, [&](dtrain::LoopbackTransport& t) {
      LoopComm lc(t);
      BroadcastOnlyComm comm{lc};
      {
        dtrain::Checkpointer<BroadcastOnlyComm> ckpt(comm, dir);
        dtrain::test::PartsState ps(n, layout, comm.rank(), 3);
        ckpt.save(1, dtrain::named("parts", ps));
      }
      if (comm.rank() == 0)
        CHECK(dtrain::test::parts_file_difference(
                  dtrain::Hdf5Format::read(dir + "/ckpt-000000000001.h5"), "/parts/w", n) == "");
    });
    fs::remove_all(dir);
  }
}

TEST_CASE("tensors held in parts: overlapping or missing parts and per-rank objects are refused") {
  using dtrain::test::PartsLayout;
  const std::size_t n = 600;
  for (int p : {2, 3}) {
    for (PartsLayout layout : {PartsLayout::overlap, PartsLayout::gap}) {
      CAPTURE(p);
      CAPTURE(static_cast<int>(layout));
      const std::string dir =
          (fs::temp_directory_path() / ("dtrain_ckpt_parts_bad_" + std::to_string(::getpid())))
              .string();
      fs::remove_all(dir);
      dtrain::run_loopback(p, [&](dtrain::LoopbackTransport& t) {
        LoopComm comm(t);
        dtrain::Checkpointer<LoopComm> ckpt(comm, dir);
        dtrain::test::PartsState ps(n, layout, comm.rank(), p);
        CHECK(dtrain::test::parts_refusal_problem(ckpt, ps, layout) == "");
        // Per-rank objects cannot hold parts of a replicated tensor.
        dtrain::test::PartsState good(n, PartsLayout::blocks, comm.rank(), p);
        CHECK_THROWS_WITH_AS(ckpt.save(1, dtrain::per_rank("parts", good)),
                             doctest::Contains("dtrain::named"), dtrain::InvalidArgument);
        // The same Checkpointer saves good parts afterwards.
        ckpt.save(2, dtrain::named("parts", good));
        CHECK(ckpt.last_step() == std::optional<std::int64_t>(2));
      });
      std::size_t files = 0;
      for (const auto& e : fs::recursive_directory_iterator(dir))
        files += e.is_regular_file() && e.path().extension() == ".h5";
      CHECK(files == 1u);
      fs::remove_all(dir);
    }
  }
}

TEST_CASE("distributed restore: ranks with nothing to read take part without opening the file") {
  // One tensor of 40 bytes, runs of at least 1 MiB: rank 0 reads it all (verification and load)
  // and ranks 1-3 have no run, so they open no reader; every rank gets the tensor by broadcast.
  const std::string dir =
      (fs::temp_directory_path() / ("dtrain_ckpt_idle_readers_" + std::to_string(::getpid())))
          .string();
  fs::remove_all(dir);
  dtrain::run_loopback(4, [&](dtrain::LoopbackTransport& t) {
    LoopComm comm(t);
    Params saved{dtrain::Tensor({10}, dtrain::DType::f32)};
    auto w = saved.w.as<float>();
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i) - 1.0f;
    {
      dtrain::Checkpointer<LoopComm> ckpt(comm, dir);
      ckpt.save(7, dtrain::named("params", saved));
    }
    dtrain::CheckpointOptions o;
    o.restore = dtrain::RestoreStrategy::distributed;
    dtrain::Checkpointer<LoopComm> ckpt(comm, dir, o);
    Params back{dtrain::Tensor({10}, dtrain::DType::f32)};
    CHECK(ckpt.restore_latest(dtrain::named("params", back)) == std::optional<std::int64_t>(7));
    auto b = back.w.as<float>();
    CHECK(std::vector<float>(b.begin(), b.end()) == std::vector<float>(w.begin(), w.end()));
  });
  fs::remove_all(dir);
}

TEST_CASE("keep_buffers off: a save's host buffers are freed once it is complete, the same file") {
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_buffers_" + std::to_string(::getpid()))).string();
  const std::string kept_dir = base + "_kept", freed_dir = base + "_freed",
                    async_dir = base + "_async";
  for (const auto& d : {kept_dir, freed_dir, async_dir}) fs::remove_all(d);
  const std::size_t n = 5000;
  dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) {
    LoopComm comm(t);
    const int r = comm.rank();
    SgdRun run(comm, n, 11, 0.25f);
    Params& p = run.p;
    std::vector<float>& g = run.g;
    dtrain::GradientSync& sync = run.sync;
    dtrain::Sgd& opt = run.opt;
    const dtrain::BufferView pv = run.pv;
    sync.shard_updates(pv, opt);  // the momentum in parts: streamed to rank 0's writer
    for (std::size_t i = 0; i < n; ++i)
      g[i] = static_cast<float>((i * 3 + static_cast<std::size_t>(r)) % 7) / 7.0f;
    sync.ready_all();
    sync.wait(opt);
    auto save = [&](const std::string& dir, bool keep, bool async) {
      dtrain::CheckpointOptions o;
      o.keep_buffers = keep;
      o.async = async;
      dtrain::Checkpointer<LoopComm> ckpt(comm, dir, o);
      ckpt.save(1, dtrain::named("params", p), dtrain::named("optimizer", opt));
      const std::size_t after_save = ckpt.buffer_bytes();
      ckpt.wait();
      return std::make_pair(after_save, ckpt.buffer_bytes());
    };
    const auto kept = save(kept_dir, true, false);
    const auto freed = save(freed_dir, false, false);
    const auto async = save(async_dir, false, true);
    // A synchronous save assembles nothing (the momentum's parts stream into rank 0's write)
    // and has no device tensors: nothing to keep.
    CHECK(kept.first == 0u);
    CHECK(kept.second == 0u);
    if (r == 0) CHECK(async.first >= 2 * n * sizeof(float));  // the snapshot the write reads
    CHECK(freed.first == 0u);
    CHECK(async.second == 0u);  // freed once the write was waited for
  });
  for (const auto& other : {freed_dir, async_dir}) {
    CAPTURE(other);
    same_tensors(kept_dir + "/ckpt-000000000001.h5", other + "/ckpt-000000000001.h5");
  }
  for (const auto& d : {kept_dir, freed_dir, async_dir}) fs::remove_all(d);
}

TEST_CASE(
    "a checkpoint changed after its verification: every rank throws, the next restore falls back") {
  // The file is verified piece by piece without keeping its tensors (by rank 0, or by every rank
  // for its runs), then each tensor (run) is read again as it loads and its crc32c checked once
  // more: a byte changed in between (here by the restore hook) fails that read, and every rank
  // throws after the restore's collectives (none waits for the reader). The damaged file then
  // fails verification and is passed over.
  SmallRuns small;
  for (auto restore : {dtrain::RestoreStrategy::rank0, dtrain::RestoreStrategy::distributed}) {
    CAPTURE(dtrain::name_of(restore));
    dtrain::CheckpointOptions ro;
    ro.restore = restore;
    const std::string dir =
        (fs::temp_directory_path() /
         ("dtrain_ckpt_changed_" + std::to_string(::getpid()) + "_" + dtrain::name_of(restore)))
            .string();
    fs::remove_all(dir);
    auto objects = [](dtrain::test::FakeRun& r) {
      return std::make_tuple(dtrain::named("model", r.model), dtrain::named("optimizer", r.opt),
                             dtrain::per_rank("sampler", r.sampler),
                             dtrain::named("dropout", r.dropout),
                             dtrain::named("schedule", r.sched));
    };
    dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) {
      LoopComm comm(t);
      dtrain::Checkpointer<LoopComm> ckpt(comm, dir);
      dtrain::test::FakeRun run(comm.rank());
      for (std::int64_t s = 1; s <= 2; ++s) {
        run.step(comm);
        std::apply([&](auto&&... o) { ckpt.save(s, o...); }, objects(run));
      }
    });
    const std::string newest = dir + "/ckpt-000000000002.h5";
    std::string victim;  // a replicated tensor of some bytes, and where they lie in the file
    for (const auto& e : dtrain::Hdf5Format::read(newest).entries)
      if (e.kind == dtrain::detail::EntryKind::tensor && e.owner < 0 && e.bytes() >= 8) {
        victim = e.path;
        break;
      }
    REQUIRE_FALSE(victim.empty());
    haddr_t offset = HADDR_UNDEF;
    {
      dtrain::detail::H5Session session;
      const hid_t f = H5Fopen(newest.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      REQUIRE(f >= 0);
      const hid_t d = H5Dopen2(f, victim.c_str(), H5P_DEFAULT);
      REQUIRE(d >= 0);
      offset = H5Dget_offset(d);
      H5Dclose(d);
      H5Fclose(f);
    }
    REQUIRE(offset != HADDR_UNDEF);
    int hooked = 0;
    dtrain::detail::ckpt_restore_hook() = [&](const std::string& file) {
      ++hooked;
      CHECK(file == newest);
      const int fd = ::open(file.c_str(), O_RDWR);
      REQUIRE(fd >= 0);
      unsigned char b = 0;
      REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
      b ^= 0x5a;
      REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
      ::close(fd);
    };
    std::vector<std::string> what(2);
    dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) {
      LoopComm comm(t);
      dtrain::Checkpointer<LoopComm> ckpt(comm, dir, ro);
      dtrain::test::FakeRun back(comm.rank());
      try {
        std::apply([&](auto&&... o) { ckpt.restore_latest(o...); }, objects(back));
      } catch (const dtrain::Error& e) {
        what[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    dtrain::detail::ckpt_restore_hook() = nullptr;
    CHECK(hooked == 1);
    for (const std::string& w : what) {
      CAPTURE(w);
      CHECK(w.find(newest + ":" + victim) != std::string::npos);
      CHECK(w.find("since the file was verified") != std::string::npos);
    }
    // Restored again: the newest file fails verification now (restoring it by name throws on
    // every rank, no fallback), step 1 comes back bit for bit.
    dtrain::run_loopback(2, [&](dtrain::LoopbackTransport& t) {
      LoopComm comm(t);
      dtrain::test::FakeRun ref(comm.rank());
      ref.step(comm);
      dtrain::Checkpointer<LoopComm> ckpt(comm, dir, ro);
      dtrain::test::FakeRun back(comm.rank());
      CHECK_THROWS_WITH_AS(
          std::apply([&](auto&&... o) { return ckpt.restore(newest, o...); }, objects(back)),
          doctest::Contains("checksum mismatch"), dtrain::Error);
      const auto step =
          std::apply([&](auto&&... o) { return ckpt.restore_latest(o...); }, objects(back));
      CHECK(step == std::optional<std::int64_t>(1));
      CHECK(dtrain::test::first_difference(ref, back) == "");
    });
    fs::remove_all(dir);
  }
}
