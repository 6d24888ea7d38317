// The training-run helpers of include/dtrain/train: what they write is read back independently
// (plain file reads, a forked process for the lock) and compared with what was asked.
#include <doctest/doctest.h>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/train/agreed.hpp>
#include <dtrain/train/check_samples.hpp>
#include <dtrain/train/csv_log.hpp>
#include <dtrain/train/evaluate.hpp>
#include <dtrain/train/json_summary.hpp>
#include <dtrain/train/progress_line.hpp>
#include <dtrain/train/replica_check.hpp>
#include <dtrain/train/run_lock.hpp>
#include <dtrain/train/step_meter.hpp>
#include <dtrain/train/straggler_monitor.hpp>
#include <dtrain/train/training_log.hpp>
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
#include <thread>
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

namespace {
// An all-reduce algorithm named up front: no calibration of `automatic` in these short tests.
CommConfig pinned() {
  CommConfig c;
  c.default_algorithm = AllreduceAlgorithm::ring;
  return c;
}
}  // namespace

TEST_CASE("agreed: an error on some ranks ends the phase on every rank, with the lowest one's") {
  for (int n : {1, 2, 3, 5}) {
    std::vector<std::string> got(static_cast<std::size_t>(n));
    std::vector<int> after(static_cast<std::size_t>(n), 0);
    run_loopback(n, [&](LoopbackTransport& t) {
      Communicator comm(t, pinned());
      const int r = comm.rank();
      try {
        agreed(comm, [&] {
          if (r >= n / 2) raise<IoError>("open", "row " + std::to_string(10 * r) + " is bad");
        });
      } catch (const AgreedError& e) {
        got[static_cast<std::size_t>(r)] = e.what();
      }
      agreed(comm, [] {});  // nothing fails: nothing is thrown, the communicator goes on
      after[static_cast<std::size_t>(r)] = 1;
    });
    const std::string want = "dtrain: rank " + std::to_string(n / 2) + ": open: row " +
                             std::to_string(10 * (n / 2)) + " is bad";
    for (int r = 0; r < n; ++r) {
      CHECK(got[static_cast<std::size_t>(r)] == want);
      CHECK(after[static_cast<std::size_t>(r)] == 1);
    }
  }
}

TEST_CASE("lock_run_directory: rank 0 holds the lock, every rank learns that it is taken") {
  const std::string dir = temp_dir() + "/run";
  std::vector<int> holds(3, 0), refused(3, 0), none(3, 0);
  run_loopback(3, [&](LoopbackTransport& t) {
    Communicator comm(t, pinned());
    const auto r = static_cast<std::size_t>(comm.rank());
    const auto lock = lock_run_directory(comm, dir);
    holds[r] = lock != nullptr;
    try {
      lock_run_directory(comm, dir);  // a second job on the same directory
    } catch (const AgreedError& e) {
      refused[r] = std::string(e.what()).find("in use by another job") != std::string::npos;
    }
    none[r] = lock_run_directory(comm, "") == nullptr;
  });
  CHECK(holds == std::vector<int>{1, 0, 0});
  CHECK(refused == std::vector<int>{1, 1, 1});
  CHECK(none == std::vector<int>{1, 1, 1});
  std::system(("rm -rf " + dir.substr(0, dir.size() - 4)).c_str());
}

TEST_CASE("StepMeter: phases, samples and losses per interval, per epoch and in total") {
  StepMeter m;
  for (int s = 0; s < 3; ++s) {
    m.start_step();
    m.data_done();
    m.compute_done();
    m.sync_done();
    m.optimizer_done();
    m.step_done(64, 1.0 + s);
  }
  const IntervalStats a = m.take_interval();
  CHECK(a.steps == 3);
  CHECK(a.samples == 192);
  CHECK(a.mean_loss == doctest::Approx(2.0));
  CHECK(a.wall_s >= a.times.total());
  CHECK(a.samples_per_s(2) == doctest::Approx(2 * 192 / a.wall_s));
  m.start_step();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  m.data_done();
  m.step_done(10, 4.0);
  CHECK(m.total_samples() == 202);
  CHECK(m.total_times().data_s >= 0.019);  // the sleep is in the data phase
  CHECK(m.epoch_mean_loss() == doctest::Approx(2.5));
  m.start_epoch();
  CHECK(std::isnan(m.epoch_mean_loss()));
  const IntervalStats b = m.take_interval();
  CHECK(b.steps == 1);
  CHECK(b.samples == 10);
  CHECK(b.mean_loss == 4.0);
  CHECK(b.times.data_s >= 0.019);
  CHECK(std::isnan(m.take_interval().mean_loss));
  StepTimes t{1, 2, 3, 4};
  CHECK(t.total() == 10);
  const PhaseTimes p = t.phases();  // as the straggler monitor counts: optimizer is compute
  CHECK(p.compute_s == 6);
  CHECK(p.data_wait_s == 1);
  CHECK(p.sync_wait_s == 3);
}

TEST_CASE("TrainingLog: rank 0's progress and metrics, every rank's timings, across a restart") {
  const std::string dir = temp_dir();
  std::string progress;
  auto run = [&](std::int64_t resumed, std::int64_t last) {
    run_loopback(2, [&](LoopbackTransport& t) {
      Communicator comm(t, pinned());
      std::FILE* out = std::tmpfile();
      TrainingLog<Communicator<LoopbackTransport>> log(comm, dir, resumed, 1, last, out);
      StepMeter meter;
      for (std::int64_t s = std::max<std::int64_t>(resumed, 0) + 1; s <= last; ++s) {
        meter.start_step();
        meter.data_done();
        meter.step_done(8, 0.5);
        if (s % 5 == 0) CHECK(log.interval(s, 0, meter, 0.01).steps == 5);
      }
      log.evaluation(last, 0, 0.01, 0.75, 0.5);
      log.message("done at " + std::to_string(last));
      if (comm.rank() == 0) {
        CHECK(log.metrics_path() == dir + "/metrics.csv");
        std::rewind(out);
        char b[4096];
        progress.assign(b, std::fread(b, 1, sizeof b, out));
      }
      std::fclose(out);
    });
  };
  run(-1, 10);  // a fresh run: interval rows 5 and 10, an evaluation row at 10
  CHECK(progress.find("step 10/10  loss 0.5000") != std::string::npos);
  CHECK(progress.find("done at 10\n") != std::string::npos);
  run(5, 15);  // resumed from a checkpoint at step 5: what followed it is written anew
  const auto m = lines_of(dir + "/metrics.csv");
  REQUIRE(m.size() == 5);
  CHECK(m[0] ==
        "step,epoch,loss,lr,train_accuracy,test_accuracy,samples_per_s,data_s,compute_s,sync_s,"
        "optimizer_s");
  CHECK(m[1].rfind("5,0,0.5,0.01,,,", 0) == 0);
  CHECK(m[2].rfind("10,0,0.5,0.01,,,", 0) == 0);
  CHECK(m[3].rfind("15,0,0.5,0.01,,,", 0) == 0);
  CHECK(m[4] == "15,0,,0.01,0.75,0.5,,,,,");
  for (const char* rank : {"00000", "00001"}) {
    const auto l = lines_of(dir + "/timing-rank-" + rank + ".csv");
    REQUIRE(l.size() == 4);
    CHECK(l[1].rfind("5,", 0) == 0);
    CHECK(l[3].rfind("15,", 0) == 0);
  }
  std::system(("rm -rf " + dir).c_str());
}

namespace {
// Row i: features {i % 3, i}, label i % 3; optionally one bad label or one NaN.
struct TinySet {
  std::size_t n = 0;
  std::int64_t bad_label_row = -1, nan_row = -1;
  std::size_t size() const { return n; }
  Shape sample_shape() const { return {2}; }
  void read(span<const std::int64_t> idx, span<float> f, span<std::int32_t> l,
            const Normalize& t) const {
    for (std::size_t i = 0; i < idx.size(); ++i) {
      const std::int64_t row = idx[i];
      l[i] = static_cast<std::int32_t>(row == bad_label_row ? 7 : row % 3);
      f[2 * i] = t.apply(static_cast<float>(row % 3));
      f[2 * i + 1] = row == nan_row ? NAN : t.apply(static_cast<float>(row));
    }
  }
};
// Right where the second feature is not a multiple of 4.
struct TinyModel {
  std::int64_t count_correct(const float* x, const std::int32_t* y, std::int64_t rows) {
    std::int64_t c = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      c += static_cast<std::int32_t>(x[2 * r]) == y[r] && static_cast<int>(x[2 * r + 1]) % 4 != 0;
    return c;
  }
};
}  // namespace

TEST_CASE("check_samples: each rank checks its share; errors name the row and the value") {
  TinySet d;
  d.n = 30;
  SampleCheck check;
  check.num_classes = 3;
  check.operation = "checking";
  check.labels_name = "'f.h5' dataset 'train/labels'";
  check.features_name = "'f.h5' dataset 'train/images'";
  FeatureStats stats;
  check_samples(d, 1, 3, check, &stats);  // rows [10, 20)
  CHECK(stats.count == 20);
  CHECK(stats.sum == doctest::Approx(145 + 10));  // 10 + ... + 19, and (i % 3) over the rows
  d.bad_label_row = 15;
  CHECK_NOTHROW(check_samples(d, 0, 3, check));  // row 15 is rank 1's
  std::string msg;
  try {
    check_samples(d, 1, 3, check);
  } catch (const IoError& e) {
    msg = e.what();
  }
  CHECK(msg.find("checking: 'f.h5' dataset 'train/labels': row 15 has label 7, outside [0, 3) "
                 "for this 3-class model") != std::string::npos);
  d.bad_label_row = -1;
  d.nan_row = 12;
  msg.clear();
  try {
    check_samples(d, 1, 3, check);
  } catch (const IoError& e) {
    msg = e.what();
  }
  CHECK(msg.find("'f.h5' dataset 'train/images': row 12 holds NaN at element 1") !=
        std::string::npos);
}

TEST_CASE("evaluate_accuracy: the same exact fraction on every rank, whatever the world size") {
  TinySet d;
  d.n = 23;
  for (int n : {1, 2, 3, 5}) {
    for (std::size_t limit : {std::size_t{10}, std::size_t{23}, std::size_t{100}}) {
      const std::size_t rows = std::min(limit, d.n);
      std::size_t right = 0;
      for (std::size_t i = 0; i < rows; ++i) right += i % 4 != 0;
      std::vector<double> got(static_cast<std::size_t>(n));
      run_loopback(n, [&](LoopbackTransport& t) {
        Communicator comm(t, pinned());
        TinyModel model;
        got[static_cast<std::size_t>(comm.rank())] =
            evaluate_accuracy(comm, model, d, Normalize{}, limit, 4);
      });
      for (double g : got) CHECK(g == static_cast<double>(right) / static_cast<double>(rows));
    }
  }
}

TEST_CASE("replicas_identical: true for the same parameters on every rank, false for one bit") {
  for (int flip : {-1, 1}) {
    std::vector<int> same(3, 0);
    run_loopback(3, [&](LoopbackTransport& t) {
      Communicator comm(t, pinned());
      Sequential model{Linear(4, 3), Relu(), Linear(3, 2)};
      model.init(7);
      if (comm.rank() == flip) {
        auto p = model.parameters().as<float>();
        p[5] = std::nextafter(p[5], 1.0f);
      }
      same[static_cast<std::size_t>(comm.rank())] = replicas_identical(comm, model);
    });
    CHECK(same == std::vector<int>(3, flip < 0 ? 1 : 0));
  }
}
