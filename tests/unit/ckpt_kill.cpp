// A writer process killed with SIGKILL in the middle of a save: the previous checkpoint still
// loads, the half-written temporary is discarded, and training resumes and saves again.
#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>

#include "ckpt/big_state.hpp"
#include "ckpt/fake_state.hpp"
#include "ckpt/test_comm.hpp"

#ifndef DTRAIN_CKPT_KILL_WRITER
#error "DTRAIN_CKPT_KILL_WRITER must name the helper binary"
#endif

extern char** environ;
namespace fs = std::filesystem;

namespace {

pid_t spawn_writer(const std::string& dir, const char* mode, const char* mib) {
  std::string exe = DTRAIN_CKPT_KILL_WRITER;
  std::vector<char*> args{exe.data(), const_cast<char*>(dir.c_str()), const_cast<char*>(mode),
                          const_cast<char*>(mib), nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, args.data(), environ) == 0);
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Runs the writer (mode, mib) and SIGKILLs it once `tmp` holds more than 8 MiB; whether it was
// killed there (false: it finished first, or never wrote that much within 60 s).
bool kill_mid_write(const std::string& dir, const char* mode, const char* mib,
                    const std::string& tmp) {
  const pid_t pid = spawn_writer(dir, mode, mib);
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::error_code ec;
    const auto size = fs::file_size(tmp, ec);
    if (!ec && size > (8u << 20)) {
      ::kill(pid, SIGKILL);
      const int st = wait_status(pid);
      return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    }
    if (waitpid(pid, nullptr, WNOHANG) == pid) return false;  // finished before it was caught
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, SIGKILL);
  wait_status(pid);
  return false;
}

}  // namespace

TEST_CASE("SIGKILL during a save leaves the previous checkpoint loadable and training resumes") {
  const std::string dir =
      (fs::temp_directory_path() / ("dtrain_ckpt_kill_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const std::string tmp = dir + "/.ckpt-000000000002.h5.tmp";
  const std::string second = dir + "/ckpt-000000000002.h5";

  const int base = wait_status(spawn_writer(dir, "base", "1"));
  REQUIRE(WIFEXITED(base));
  REQUIRE(WEXITSTATUS(base) == 0);
  REQUIRE(fs::exists(dir + "/ckpt-000000000001.h5"));

  // Kill the big save once its temporary file holds some data; retry with a larger file if the
  // writer was too quick to be caught (the cache can absorb a whole file in a blink).
  bool killed_mid_write = false;
  for (const char* mib : {"256", "768"}) {
    killed_mid_write = kill_mid_write(dir, "big", mib, tmp);
    if (killed_mid_write) break;
    fs::remove(second);
  }
  REQUIRE(killed_mid_write);
  CHECK_FALSE(fs::exists(second));
  CHECK(fs::exists(tmp));

  dtrain::test::run_ranks(1, [&](dtrain::test::ThreadComm& comm) {
    dtrain::Checkpointer<dtrain::test::ThreadComm> ckpt(comm, dir);
    CHECK_FALSE(fs::exists(tmp));  // the half-written file was discarded at start
    dtrain::test::FakeRun run(0), expected(0);
    dtrain::test::BigState big(1);
    expected.step(comm);
    auto step = ckpt.restore_latest(dtrain::named("model", run.model),
                                    dtrain::named("optimizer", run.opt), dtrain::named("big", big));
    REQUIRE(step.has_value());
    CHECK(*step == 1);
    CHECK(big.holds(1));
    CHECK(dtrain::test::first_difference(expected, run).find("model") == std::string::npos);
    CHECK(dtrain::test::first_difference(expected, run).find("opt") == std::string::npos);
    // Training resumes: the next save and restore work as usual.
    run.step(comm);
    ckpt.save(2, dtrain::named("model", run.model), dtrain::named("optimizer", run.opt),
              dtrain::named("big", big));
    dtrain::test::FakeRun again(0);
    dtrain::test::BigState big2(1);
    CHECK(ckpt.restore_latest(dtrain::named("model", again.model),
                              dtrain::named("optimizer", again.opt),
                              dtrain::named("big", big2)) == std::optional<std::int64_t>(2));
    CHECK(big2.holds(1));
    const std::string diff = dtrain::test::first_difference(run, again);
    CHECK(diff.find("model") == std::string::npos);
    CHECK(diff.find("opt") == std::string::npos);
  });
  fs::remove_all(dir);
}

// The same with multi-level checkpoints (2 ranks as 2 fake nodes): the writer is killed while
// checkpoint 2 is being written at one level (node-local, the partner copy, the shared flush).
// Nothing is lost: what was published before the kill restores, at the level that holds it.
TEST_CASE("SIGKILL during each level's write: the previous checkpoint restores") {
  const std::string dir =
      (fs::temp_directory_path() / ("dtrain_ckpt_kill_levels_" + std::to_string(::getpid())))
          .string();
  const char* file = "ckpt-000000000002.h5";
  for (const std::string level : {"node0", "node1", "shared"}) {
    CAPTURE(level);
    fs::remove_all(dir);
    const int base = wait_status(spawn_writer(dir, "levels-base", "1"));
    REQUIRE(WIFEXITED(base));
    REQUIRE(WEXITSTATUS(base) == 0);
    REQUIRE(fs::exists(dir + "/shared/ckpt-000000000001.h5"));
    // Killed once the temporary of checkpoint 2 at this level holds some data.
    const std::string tmp = dir + "/" + level + "/." + file + ".tmp";
    bool killed_mid_write = false;
    long used_mib = 0;
    for (const char* mib : {"192", "512"}) {
      used_mib = std::atol(mib);
      killed_mid_write = kill_mid_write(dir, "levels-big", mib, tmp);
      if (killed_mid_write) break;
      for (const char* d : {"/node0/", "/node1/", "/shared/"}) fs::remove(dir + d + file);
    }
    REQUIRE(killed_mid_write);
    CHECK_FALSE(fs::exists(dir + "/" + level + "/" + file));
    // Checkpoint 2 is complete at the levels written before the one killed; step 1 everywhere.
    const std::int64_t newest = level == "node0" ? 1 : 2;
    auto restore = [&](std::int64_t want, dtrain::CheckpointLevel where) {
      const long mib = want == 1 ? 1 : used_mib;
      dtrain::test::run_ranks(2, [&](dtrain::test::ThreadComm& comm) {
        dtrain::CheckpointOptions o;
        o.levels.local_dir = dir + "/node" + std::to_string(comm.rank());
        o.levels.node = comm.rank();
        dtrain::Checkpointer<dtrain::test::ThreadComm> ckpt(comm, dir + "/shared", o);
        CHECK_FALSE(fs::exists(tmp));  // the half-written file was discarded at start
        dtrain::test::FakeRun run(0), expected(0);
        dtrain::test::BigState big(mib);
        for (std::int64_t s = 1; s <= want; ++s) expected.step(comm);
        const auto step =
            ckpt.restore_latest(dtrain::named("model", run.model),
                                dtrain::named("optimizer", run.opt), dtrain::named("big", big));
        REQUIRE(step.has_value());
        CHECK(*step == want);
        CHECK(ckpt.restored_level() == where);
        CHECK(big.holds(static_cast<std::uint32_t>(want)));
        CHECK(dtrain::test::first_difference(expected, run).find("model") == std::string::npos);
      });
    };
    restore(newest, dtrain::CheckpointLevel::local);
    if (newest == 2) {  // written on node 0 before the kill; its older copy stays too
      fs::remove(dir + "/node0/" + std::string(file));
      fs::remove(dir + "/node1/" + std::string(file));
      restore(1, dtrain::CheckpointLevel::local);
    }
    // Without the node-local directories the shared level still has checkpoint 1.
    fs::remove_all(dir + "/node0");
    fs::remove_all(dir + "/node1");
    restore(1, dtrain::CheckpointLevel::shared);
  }
  fs::remove_all(dir);
}
