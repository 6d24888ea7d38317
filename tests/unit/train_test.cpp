// The training-run helpers of include/dtrain/train: what they write is read back independently
// (plain file reads, a forked process for the lock) and compared with what was asked.
#include <doctest/doctest.h>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/train/csv_log.hpp>
#include <dtrain/train/json_summary.hpp>
#include <dtrain/train/progress_line.hpp>
#include <dtrain/train/run_lock.hpp>
#include <dtrain/train/straggler_monitor.hpp>
#include <dtrain/transports/loopback.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace dtrain;

namespace {
std::string temp_dir() {
  char tmpl[] = "/tmp/dtrain_train_test_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}
std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}
}  // namespace

TEST_CASE("CsvLog keeps earlier rows up to the resumed step and drops the later ones") {
  const std::string dir = temp_dir(), path = dir + "/m.csv";
  {
    CsvLog log(path, {"step", "loss", "acc"}, -1);
    for (int s = 10; s <= 50; s += 10) log.row({double(s), 1.0 / s, NAN});
  }
  {
    CsvLog log(path, {"step", "loss", "acc"}, 30);  // resumed from a checkpoint at step 30
    CHECK(log.kept_rows() == 3);
    log.row({40, 0.5, 0.75});
  }
  const auto l = lines_of(path);
  REQUIRE(l.size() == 5);
  CHECK(l[0] == "step,loss,acc");
  CHECK(l[1] == "10,0.1,");
  CHECK(l[3] == "30,0.0333333333,");
  CHECK(l[4] == "40,0.5,0.75");
  {
    CsvLog log(path, {"step", "other"}, 100);  // other columns: the old file is moved aside
    CHECK(log.kept_rows() == 0);
  }
  CHECK(lines_of(path + ".previous").size() == 5);
  CHECK(lines_of(path) == std::vector<std::string>{"step,other"});
  {
    CsvLog log(path, {"step", "other"}, -1);
    CHECK_THROWS_AS(log.row({1}), InvalidArgument);
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("CsvLog::row reports a row it cannot write") {
  // In a child process: a file size limit (SIGXFSZ ignored) makes the next append fail with
  // EFBIG, which must be an IoError naming the file, not a silently lost row.
  const std::string dir = temp_dir(), path = dir + "/m.csv";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 1;
    try {
      CsvLog log(path, {"step", "loss"}, -1);
      log.row({1, 0.5});
      std::signal(SIGXFSZ, SIG_IGN);
      struct rlimit lim;
      ::getrlimit(RLIMIT_FSIZE, &lim);
      struct stat st;
      ::stat(path.c_str(), &st);
      lim.rlim_cur = static_cast<rlim_t>(st.st_size);  // the file may not grow
      ::setrlimit(RLIMIT_FSIZE, &lim);
      try {
        log.row({2, 0.25});
      } catch (const IoError& e) {
        const std::string what = e.what();
        code = what.find(path) != std::string::npos && what.find("step 2") != std::string::npos ? 0
                                                                                                : 2;
      }
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("StragglerMonitor names the slowest rank against the median of compute + data wait") {
  // Rank 2 computes 30% longer; sync wait (the fast ranks' idle time) does not count.
  const std::vector<double> all{1.0, 0.1, 0.5, 1.0, 0.1, 0.4, 1.3, 0.1, 0.0, 1.02, 0.1, 0.3};
  const auto r = StragglerMonitor<Communicator<LoopbackTransport>>::analyse(all, 0.10);
  CHECK(r.slowest_rank == 2);
  CHECK(r.median_busy_s == doctest::Approx(1.11));
  CHECK(r.lagging);
  CHECK(r.describe() == "slowest: rank 2, +26% vs median");
  const std::vector<double> even{1.0, 0.0, 0.0, 1.05, 0.0, 0.0};
  CHECK_FALSE(StragglerMonitor<Communicator<LoopbackTransport>>::analyse(even, 0.10).lagging);

  // Through the collective: every rank learns the same report, every rank writes its own file.
  const std::string dir = temp_dir();
  std::vector<StragglerReport> seen(3);
  run_loopback(3, [&](LoopbackTransport& t) {
    Communicator comm(t);
    const int r = comm.rank();
    StragglerMonitor<Communicator<LoopbackTransport>> m(
        comm, dir + "/timing-" + std::to_string(r) + ".csv", -1);
    seen[static_cast<std::size_t>(r)] =
        m.exchange(100, 100, PhaseTimes{r == 1 ? 2.0 : 1.0, 0.1, r == 1 ? 0.0 : 1.0});
  });
  for (const auto& s : seen) {
    CHECK(s.slowest_rank == 1);
    CHECK(s.lagging);
  }
  const auto l = lines_of(dir + "/timing-1.csv");
  REQUIRE(l.size() == 2);
  CHECK(l[0] == "step,rank,interval_steps,compute_s,data_wait_s,sync_wait_s");
  CHECK(l[1] == "100,1,100,2,0.1,0");
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("ProgressLine formats step, loss, throughput and ETA; plain lines off a terminal") {
  ProgressState s;
  s.epoch = 2;
  s.epochs = 10;
  s.step = 40;
  s.total_steps = 4690;
  s.loss = 0.43217;
  s.samples_per_s = 12345.4;
  s.note = "slowest: rank 1, +20% vs median";
  CHECK(ProgressLine::format(s, 83.0) ==
        "epoch 3/10  step   40/4690  loss 0.4322  12345 samples/s  ETA 1m23s  slowest: rank 1, "
        "+20% vs median");
  CHECK(ProgressLine::duration(3725) == "1h02m");
  CHECK(ProgressLine::duration(NAN) == "?");
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  ProgressLine p(f, false);
  CHECK(std::isnan(p.eta_seconds(s)));
  p.update(s);
  s.step = 80;
  p.update(s);
  CHECK(p.eta_seconds(s) >= 0);
  std::rewind(f);
  char buf[512] = {0};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string text(buf, n);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 2);
}

TEST_CASE("JsonSummary writes a flat object atomically, escaping strings, null for NaN") {
  const std::string dir = temp_dir(), path = dir + "/s.json";
  JsonSummary js;
  js.add("test_accuracy", 0.5).add("steps", std::int64_t{469}).add("ok", true);
  js.add("name", "a \"b\"\n").add("loss", NAN).add_raw("resumed_from_step", "null");
  js.add("steps", std::int64_t{470});  // replaces, keeps the position
  js.write(path);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str() ==
        "{\n  \"test_accuracy\": 0.5,\n  \"steps\": 470,\n  \"ok\": true,\n  \"name\": \"a "
        "\\\"b\\\"\\n\",\n  \"loss\": null,\n  \"resumed_from_step\": null\n}\n");
  CHECK(lines_of(path + ".tmp").empty());
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("RunDirLock: one holder at a time, released when the holder dies") {
  const std::string dir = temp_dir() + "/run/a";  // parents are created
  {
    RunDirLock first(dir);
    std::string msg;
    try {
      RunDirLock second(dir);
    } catch (const IoError& e) {
      msg = e.what();
    }
    CHECK(msg.find("in use by another job") != std::string::npos);
    CHECK(msg.find("pid " + std::to_string(::getpid())) != std::string::npos);
  }
  // A child process takes the lock and dies without cleaning up: the lock goes with it.
  int to_parent[2];
  REQUIRE(::pipe(to_parent) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    RunDirLock held(dir);
    char c = 'x';
    (void)!::write(to_parent[1], &c, 1);
    ::pause();  // killed by the parent
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(to_parent[0], &c, 1) == 1);
  CHECK_THROWS_AS(RunDirLock{dir}, IoError);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK_NOTHROW(RunDirLock{dir});
  std::system(("rm -rf " + dir.substr(0, dir.size() - 6)).c_str());
}
