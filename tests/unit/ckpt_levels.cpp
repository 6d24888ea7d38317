// Multi-level checkpoints over ranks as threads, with fake nodes and a node-local directory per
// fake node: where each level's files land, restore from the partner copy after a node's
// directory is lost (bit-exact), from the shared level when a node and its partner are lost,
// damage at each level, the shared flush in the background, the library's Communicator over the
// loopback transport (its own node map, messages between two ranks) and a transfer deadline.
// The run's identity: node-local directories left by another run are not restored, a run
// continued on purpose adopts the identity, and a rollback of the run directory is not undone by
// the node-local copies of later steps.
#include <doctest/doctest.h>

#include <hdf5.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/test_comm.hpp"

namespace fs = std::filesystem;
using dtrain::Checkpointer;
using dtrain::CheckpointLevel;
using dtrain::named;
using dtrain::per_rank;
using dtrain::test::FakeRun;
using dtrain::test::run_ranks;
using dtrain::test::ThreadComm;

namespace {

// A run directory (the shared level) and one node-local directory per fake node.
struct LvDirs {
  std::string base;
  explicit LvDirs(const std::string& name) {
    static std::atomic<int> counter{0};
    base =
        (fs::temp_directory_path() / ("dtrain_levels_" + name + "_" + std::to_string(::getpid()) +
                                      "_" + std::to_string(counter++)))
            .string();
    fs::remove_all(base);
  }
  ~LvDirs() { fs::remove_all(base); }
  std::string shared() const { return base + "/shared"; }
  std::string local(int node) const { return base + "/node" + std::to_string(node); }
  std::string file(const std::string& dir, std::int64_t step) const {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(step));
    return dir + "/ckpt-" + digits + ".h5";
  }
};

dtrain::CheckpointOptions lv_level_opts(const LvDirs& d, int node, int shared_every = 1) {
  dtrain::CheckpointOptions o;
  o.keep_last = 3;
  o.levels.local_dir = d.local(node);
  o.levels.node = node;
  o.levels.local_every = 1;
  o.levels.shared_every = shared_every;
  o.levels.transfer_timeout_seconds = 30;
  return o;
}

template <class C>
void lv_save_run(C& ckpt, std::int64_t step, FakeRun& r) {
  ckpt.save(step, named("model", r.model), named("optimizer", r.opt),
            per_rank("sampler", r.sampler), named("dropout", r.dropout),
            named("schedule", r.sched));
}
template <class C>
std::optional<std::int64_t> lv_restore_run(C& ckpt, FakeRun& r) {
  return ckpt.restore_latest(named("model", r.model), named("optimizer", r.opt),
                             per_rank("sampler", r.sampler), named("dropout", r.dropout),
                             named("schedule", r.sched));
}

std::string lv_bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Flips one byte of the optimizer's first moment in a checkpoint file (found with HDF5 itself).
void lv_damage(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, "/optimizer/m/0", H5P_DEFAULT);
  const haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(off + 5));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  io.seekp(static_cast<std::streamoff>(off + 5));
  io.write(&c, 1);
}

// 4 ranks, 2 fake nodes of 2 ranks: saves steps 1..last of one run (every step to the node-local
// level, every `shared_every`-th to the shared level).
void lv_train_and_save(const LvDirs& d, int last, int shared_every) {
  run_ranks(4, [&](ThreadComm& comm) {
    const int node = comm.rank() / 2;
    Checkpointer<ThreadComm> ckpt(comm, d.shared(), lv_level_opts(d, node, shared_every));
    CHECK(ckpt.nodes() == 2);
    CHECK(ckpt.node() == node);
    FakeRun r(comm.rank());
    for (int s = 1; s <= last; ++s) {
      r.step(comm);
      lv_save_run(ckpt, s, r);
    }
    ckpt.wait();
  });
}

// Restores on 4 ranks / 2 fake nodes; checks that the restored state is bit for bit the state
// of the run that saved it (replayed: the training step is deterministic), and returns rank 0's
// level and node.
std::pair<CheckpointLevel, int> lv_restore_and_check(const LvDirs& d, std::int64_t want_step) {
  std::pair<CheckpointLevel, int> where{CheckpointLevel::none, -2};
  std::mutex m;
  run_ranks(4, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, d.shared(), lv_level_opts(d, comm.rank() / 2));
    FakeRun r(comm.rank() + 100);
    const auto step = lv_restore_run(ckpt, r);
    REQUIRE(step.has_value());
    CHECK(*step == want_step);
    FakeRun expected(comm.rank());
    for (std::int64_t s = 1; s <= want_step; ++s) expected.step(comm);
    CHECK(dtrain::test::first_difference(expected, r) == "");
    std::lock_guard<std::mutex> lock(m);
    if (comm.rank() == 0) {
      where = {ckpt.restored_level(), ckpt.restored_node()};
    } else {
      // Every rank learns the same level.
      CHECK(ckpt.restored_level() != CheckpointLevel::none);
    }
  });
  return where;
}

}  // namespace

TEST_CASE("levels: each save is node-local, copied to the partner node, flushed every M-th") {
  LvDirs d("where");
  lv_train_and_save(d, 4, 2);
  for (int s = 2; s <= 4; ++s) {
    CAPTURE(s);
    const std::string local = d.file(d.local(0), s);
    REQUIRE(fs::exists(local));
    // The partner copy on node 1 is the same file, byte for byte.
    REQUIRE(fs::exists(d.file(d.local(1), s)));
    CHECK(lv_bytes_of(local) == lv_bytes_of(d.file(d.local(1), s)));
  }
  CHECK_FALSE(fs::exists(d.file(d.local(0), 1)));  // keep_last = 3 on every level
  // Every second save reached the shared level, the same file again.
  CHECK(fs::exists(d.file(d.shared(), 2)));
  CHECK(fs::exists(d.file(d.shared(), 4)));
  CHECK_FALSE(fs::exists(d.file(d.shared(), 3)));
  CHECK(lv_bytes_of(d.file(d.shared(), 4)) == lv_bytes_of(d.file(d.local(0), 4)));
  // Only ranks 0 and 2 (the nodes' leaders) touch node-local directories; no temporaries left.
  for (const auto& e : fs::recursive_directory_iterator(d.base))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  const auto where = lv_restore_and_check(d, 4);
  CHECK(where.first == CheckpointLevel::local);
  CHECK(where.second == 0);
}

TEST_CASE("levels: a lost node-local directory is restored from the partner copy, bit-exact") {
  LvDirs d("partner");
  lv_train_and_save(d, 3, 0);  // no shared level at all
  CHECK(dtrain::detail::list_checkpoint_files(d.shared(), "ckpt", ".h5").empty());
  fs::remove_all(d.local(0));
  const auto where = lv_restore_and_check(d, 3);
  CHECK(where.first == CheckpointLevel::partner);
  CHECK(where.second == 1);
  // Node 0's copy was rebuilt from the partner's.
  REQUIRE(fs::exists(d.file(d.local(0), 3)));
  CHECK(lv_bytes_of(d.file(d.local(0), 3)) == lv_bytes_of(d.file(d.local(1), 3)));
  // The next restore finds it on node 0 again.
  CHECK(lv_restore_and_check(d, 3).first == CheckpointLevel::local);
}

TEST_CASE("levels: a node and its partner lost (or a new node set): the shared level, bit-exact") {
  LvDirs d("shared");
  lv_train_and_save(d, 3, 1);
  fs::remove_all(d.local(0));
  fs::remove_all(d.local(1));
  const auto where = lv_restore_and_check(d, 3);
  CHECK(where.first == CheckpointLevel::shared);
  CHECK(where.second == -1);
}

TEST_CASE("levels: a damaged file at each level is detected and the next level is used") {
  LvDirs d("damage");
  lv_train_and_save(d, 3, 1);
  // Node-local copy damaged: the partner's copy of the same step.
  lv_damage(d.file(d.local(0), 3));
  auto where = lv_restore_and_check(d, 3);
  CHECK(where.first == CheckpointLevel::partner);
  CHECK(fs::exists(d.file(d.local(0), 3) + ".damaged"));
  // Both node-local copies damaged: the shared level, same step.
  lv_damage(d.file(d.local(0), 3));  // the rebuilt copy
  lv_damage(d.file(d.local(1), 3));
  where = lv_restore_and_check(d, 3);
  CHECK(where.first == CheckpointLevel::shared);
  CHECK(fs::exists(d.file(d.local(1), 3) + ".damaged"));
  // Every level damaged for step 3: step 2, from node 0.
  lv_damage(d.file(d.shared(), 3));
  fs::remove(d.file(d.local(0), 3));
  fs::remove(d.file(d.local(1), 3));
  where = lv_restore_and_check(d, 2);
  CHECK(where.first == CheckpointLevel::local);
  CHECK(fs::exists(d.file(d.shared(), 3) + ".damaged"));
  // Nothing valid anywhere: IoError on every rank, naming the levels.
  for (const auto& e : fs::recursive_directory_iterator(d.base))
    if (e.path().extension() == ".h5") lv_damage(e.path().string());
  CHECK_THROWS_WITH_AS(lv_restore_and_check(d, 0),
                       doctest::Contains("no valid checkpoint at any level"), dtrain::Error);
}

// The identity in a run directory's dtrain-run-id file.
std::string lv_run_id(const std::string& run_dir) {
  std::string id = lv_bytes_of(run_dir + "/dtrain-run-id");
  while (!id.empty() && id.back() == '\n') id.pop_back();
  return id;
}

// Reads the identity and the step followed (root attributes) of a checkpoint file with HDF5.
std::pair<std::string, std::int64_t> lv_identity_of(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t a = H5Aopen(f, "run_id", H5P_DEFAULT);
  hid_t t = H5Aget_type(a);
  std::string id(H5Tget_size(t), '\0');
  H5Aread(a, t, id.data());
  H5Tclose(t);
  H5Aclose(a);
  id.resize(id.find('\0') == std::string::npos ? id.size() : id.find('\0'));
  std::int64_t shared_step = -2;
  a = H5Aopen(f, "shared_step", H5P_DEFAULT);
  H5Aread(a, H5T_NATIVE_INT64, &shared_step);
  H5Aclose(a);
  H5Fclose(f);
  return {id, shared_step};
}

TEST_CASE("levels: node-local copies of another run are set aside, not restored") {
  LvDirs d("other_run");
  lv_train_and_save(d, 3, 1);  // run A: node-local steps 1..3 on nodes 0 and 1
  const std::string a_id = lv_run_id(d.shared());
  CHECK(a_id.size() == 32);
  for (int n = 0; n < 2; ++n) CHECK(lv_identity_of(d.file(d.local(n), 3)).first == a_id);
  CHECK(lv_identity_of(d.file(d.shared(), 3)) == std::make_pair(a_id, std::int64_t{3}));
  // Run B: another run directory, the same node-local directories (a later job on the nodes).
  const std::string b_dir = d.base + "/shared_b";
  run_ranks(4, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, b_dir, lv_level_opts(d, comm.rank() / 2));
    CHECK(ckpt.run_id() != a_id);
    FakeRun r(comm.rank() + 100);
    CHECK_FALSE(lv_restore_run(ckpt, r).has_value());  // a fresh run
    CHECK(ckpt.restored_level() == CheckpointLevel::none);
  });
  // Refused on node 0 by rank 0 and on node 1 by its own leader; kept for inspection.
  for (int n = 0; n < 2; ++n)
    for (int s = 1; s <= 3; ++s) {
      CAPTURE(n);
      CAPTURE(s);
      CHECK_FALSE(fs::exists(d.file(d.local(n), s)));
      CHECK(fs::exists(d.file(d.local(n), s) + ".stale"));
    }
  CHECK(lv_run_id(b_dir) != a_id);
}

TEST_CASE("levels: a run continued on purpose adopts its identity (DTRAIN_CKPT_RUN_ID)") {
  LvDirs d("adopt");
  lv_train_and_save(d, 3, 0);  // nothing in the run directory
  const std::string a_id = lv_run_id(d.shared());
  // The run directory is lost; a new one continues the run from its node-local copies.
  fs::remove_all(d.shared());
  ::setenv("DTRAIN_CKPT_RUN_ID", a_id.c_str(), 1);
  const auto where = lv_restore_and_check(d, 3);
  ::unsetenv("DTRAIN_CKPT_RUN_ID");
  CHECK(where.first == CheckpointLevel::local);
  CHECK(lv_run_id(d.shared()) == a_id);  // written for the run's next jobs
  // A malformed identity is refused on every rank, naming the variable.
  ::setenv("DTRAIN_CKPT_RUN_ID", "two words", 1);
  CHECK_THROWS_WITH_AS(lv_restore_and_check(d, 3), doctest::Contains("DTRAIN_CKPT_RUN_ID"),
                       dtrain::InvalidArgument);
  ::unsetenv("DTRAIN_CKPT_RUN_ID");
}

TEST_CASE("levels: a rollback of the run directory is not undone by node-local copies") {
  LvDirs d("rollback");
  // Node-local steps 3, 4, 5 (keep_last 3), the run directory steps 2 and 4.
  lv_train_and_save(d, 5, 2);
  CHECK(lv_identity_of(d.file(d.local(0), 3)).second == 2);  // follows step 2
  CHECK(lv_identity_of(d.file(d.local(0), 4)).second == 4);  // flushed itself
  // The run directory's record of what it received: a copy that follows a newer step than this
  // (its flush never completed) is restored, one that follows a step missing below it is not.
  CHECK(lv_bytes_of(d.shared() + "/ckpt-flushed") == "4\n");
  // Roll back to step 2: its newer checkpoint deleted from the run directory.
  fs::remove(d.file(d.shared(), 4));
  const auto where = lv_restore_and_check(d, 2);
  CHECK(where.first == CheckpointLevel::shared);
  CHECK(lv_bytes_of(d.shared() + "/ckpt-flushed") == "2\n");  // rolled back with it
  // Every later copy is set aside on both nodes, including step 3, which follows step 2.
  for (int n = 0; n < 2; ++n)
    for (int s = 3; s <= 5; ++s) {
      CAPTURE(n);
      CAPTURE(s);
      CHECK_FALSE(fs::exists(d.file(d.local(n), s)));
      CHECK(fs::exists(d.file(d.local(n), s) + ".stale"));
    }
  // The run continues from step 2; its new step 3 is restored from the node-local level.
  run_ranks(4, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, d.shared(), lv_level_opts(d, comm.rank() / 2, 2));
    FakeRun r(comm.rank() + 100);
    CHECK(lv_restore_run(ckpt, r) == std::optional<std::int64_t>(2));
    r.step(comm);
    lv_save_run(ckpt, 3, r);
    ckpt.wait();
  });
  CHECK(lv_identity_of(d.file(d.local(1), 3)).second == 2);
  CHECK(lv_restore_and_check(d, 3).first == CheckpointLevel::local);
}

TEST_CASE("levels: which copies are this run's (the rule on its own)") {
  using dtrain::detail::copy_refusal;
  const std::vector<std::int64_t> shared{30, 40};       // the run directory; it received up to 40
  CHECK(copy_refusal("a", 40, "a", shared, 40) == "");  // follows a step it holds
  CHECK(copy_refusal("a", -1, "a", shared, 40) == "");  // follows nothing
  CHECK(copy_refusal("a", 10, "a", shared, 40) == "");  // follows a step pruned by keep_last
  CHECK(copy_refusal("a", 50, "a", shared, 40) == "");  // its flush never completed
  CHECK(copy_refusal("a", 50, "a", {}, -1) == "");      // a new run directory (adopted)
  CHECK(copy_refusal("a", 35, "a", shared, 40).find("rolled back") != std::string::npos);
  CHECK(copy_refusal("a", 40, "a", {30}, 40).find("step 40") != std::string::npos);
  CHECK(copy_refusal("a", 20, "a", {}, 40).find("rolled back") != std::string::npos);
  CHECK(copy_refusal("b", 40, "a", shared, 40).find("belongs to run b, this run is a") !=
        std::string::npos);
  CHECK(copy_refusal("", 40, "a", shared, 40).find("before run identities") != std::string::npos);
  CHECK(dtrain::detail::valid_run_id(dtrain::detail::make_run_id()));
  CHECK_FALSE(dtrain::detail::valid_run_id(""));
  CHECK_FALSE(dtrain::detail::valid_run_id("a b"));
  CHECK_FALSE(dtrain::detail::valid_run_id(std::string(129, 'a')));
}

TEST_CASE("levels: the shared flush runs in the background, after the save returned") {
  LvDirs d("flush");
  // The flush thread waits at its first chunk until the test has seen the save return.
  std::mutex m;
  std::condition_variable cv;
  bool save_returned = false, flush_started = false;
  dtrain::detail::ckpt_flush_hook() = [&](std::int64_t, std::uint64_t done, std::uint64_t) {
    if (done != 0) return;
    std::unique_lock<std::mutex> lock(m);
    flush_started = true;
    cv.notify_all();
    cv.wait(lock, [&] { return save_returned; });
  };
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, d.shared(), lv_level_opts(d, comm.rank()));
    FakeRun r(comm.rank());
    r.step(comm);
    lv_save_run(ckpt, 1, r);
    if (comm.rank() == 0) {
      // The save is back, the node-local and partner copies are complete, the flush is not.
      CHECK(fs::exists(d.file(d.local(0), 1)));
      CHECK(fs::exists(d.file(d.local(1), 1)));
      CHECK(ckpt.flush_in_progress());
      CHECK_FALSE(fs::exists(d.file(d.shared(), 1)));
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return flush_started; });
      save_returned = true;
      cv.notify_all();
    }
    ckpt.wait();  // collective: the flush is complete on return
    if (comm.rank() == 0) {
      CHECK_FALSE(ckpt.flush_in_progress());
      CHECK(lv_bytes_of(d.file(d.shared(), 1)) == lv_bytes_of(d.file(d.local(0), 1)));
    }
  });
  dtrain::detail::ckpt_flush_hook() = nullptr;
}

TEST_CASE("levels: options are checked, and a communicator without a node map needs levels.node") {
  LvDirs d("opts");
  run_ranks(2, [&](ThreadComm& comm) {
    dtrain::CheckpointOptions o;
    o.levels.local_dir = d.local(0);
    CHECK_THROWS_WITH_AS(Checkpointer<ThreadComm>(comm, d.shared(), o),
                         doctest::Contains("set CheckpointLevelOptions::node"),
                         dtrain::InvalidArgument);
    o.levels.node = 0;
    o.async = true;
    CHECK_THROWS_AS(Checkpointer<ThreadComm>(comm, d.shared(), o), dtrain::InvalidArgument);
  });
}

TEST_CASE("levels: environment variables") {
  ::setenv("DTRAIN_CKPT_LOCAL_DIR", "/dev/shm/job", 1);
  ::setenv("DTRAIN_CKPT_LOCAL_EVERY", "50", 1);
  ::setenv("DTRAIN_CKPT_PARTNER", "off", 1);
  ::setenv("DTRAIN_CKPT_SHARED_EVERY", "4", 1);
  const auto l = dtrain::CheckpointLevelOptions::from_env();
  CHECK(l.local_dir == "/dev/shm/job");
  CHECK(l.local_every == 50);
  CHECK_FALSE(l.partner);
  CHECK(l.shared_every == 4);
  ::setenv("DTRAIN_CKPT_SHARED_EVERY", "4x", 1);
  CHECK_THROWS_WITH_AS(dtrain::CheckpointLevelOptions::from_env(),
                       doctest::Contains("DTRAIN_CKPT_SHARED_EVERY"), dtrain::InvalidArgument);
  for (const char* v : {"DTRAIN_CKPT_LOCAL_DIR", "DTRAIN_CKPT_LOCAL_EVERY", "DTRAIN_CKPT_PARTNER",
                        "DTRAIN_CKPT_SHARED_EVERY"})
    ::unsetenv(v);
  CHECK_FALSE(dtrain::CheckpointLevelOptions::from_env().enabled());
}

using LoopComm = dtrain::Communicator<dtrain::LoopbackTransport>;

TEST_CASE("levels over Communicator<LoopbackTransport>: the transport's node map, messages") {
  LvDirs d("loop");
  dtrain::SharedSegmentConfig seg;
  seg.enabled = false;
  // 3 ranks on 3 nodes: rank 0's partner is node 1 (rank 1).
  dtrain::LoopbackWorld world({0, 1, 2}, seg);
  auto opts = [&](int rank) {
    dtrain::CheckpointOptions o;
    o.levels.local_dir = d.local(rank);  // ranks are their nodes here
    o.levels.local_every = 2;
    o.levels.shared_every = 0;
    return o;
  };
  dtrain::run_loopback(world, [&](dtrain::LoopbackTransport& t) {
    LoopComm comm(t);
    Checkpointer<LoopComm> ckpt(comm, d.shared(), opts(comm.rank()));
    CHECK(ckpt.nodes() == 3);
    FakeRun r(comm.rank());
    for (int s = 1; s <= 4; ++s) {
      r.step(comm);
      ckpt.maybe_save(s, named("model", r.model), named("optimizer", r.opt),
                      per_rank("sampler", r.sampler), named("dropout", r.dropout),
                      named("schedule", r.sched));
    }
  });
  CHECK(fs::exists(d.file(d.local(1), 4)));
  CHECK_FALSE(fs::exists(d.file(d.local(1), 3)));
  CHECK_FALSE(fs::exists(d.file(d.local(2), 4)));  // only the partner holds a copy
  fs::remove_all(d.local(0));
  dtrain::run_loopback(world, [&](dtrain::LoopbackTransport& t) {
    LoopComm comm(t);
    Checkpointer<LoopComm> ckpt(comm, d.shared(), opts(comm.rank()));
    FakeRun r(comm.rank() + 10);
    CHECK(lv_restore_run(ckpt, r) == std::optional<std::int64_t>(4));
    CHECK(ckpt.restored_level() == CheckpointLevel::partner);
    CHECK(ckpt.restored_node() == 1);
    FakeRun expected(comm.rank());
    for (int s = 1; s <= 4; ++s) expected.step(comm);
    CHECK(dtrain::test::first_difference(expected, r) == "");
  });
}

TEST_CASE("levels: a partner transfer whose peer never comes names rank, operation and peer") {
  dtrain::SharedSegmentConfig seg;
  seg.enabled = false;
  dtrain::LoopbackWorld world({0, 1}, seg);
  LvDirs d("deadline");
  fs::create_directories(d.local(1));
  dtrain::run_loopback(world, [&](dtrain::LoopbackTransport& t) {
    LoopComm comm(t);
    if (comm.rank() != 1) return;  // rank 0 never sends
    dtrain::detail::CkptTarget to;
    to.dir = d.local(1);
    to.prefix = "ckpt";
    to.extension = ".h5";
    to.tmp_path = d.local(1) + "/.x.tmp";
    to.final_path = d.local(1) + "/x.h5";
    const auto err =
        dtrain::detail::ckpt_transfer_file(comm, 0, 1, "", to, 0.2, "checkpoint partner copy");
    REQUIRE(err);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(err),
                         doctest::Contains("rank 1: checkpoint partner copy: receive of 16 B from "
                                           "rank 0 timed out"),
                         dtrain::TimeoutError);
    CHECK_FALSE(fs::exists(to.final_path));
  });
}
