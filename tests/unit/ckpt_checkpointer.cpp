// Checkpointer over N ranks as N threads: round trip of every dtype, bit-exact resume, damaged
// files, mismatches, retention, intervals, asynchronous saves and world-size changes.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/test_comm.hpp"

namespace fs = std::filesystem;
using dtrain::Checkpointer;
using dtrain::CheckpointOptions;
using dtrain::named;
using dtrain::per_rank;
using dtrain::test::FakeRun;
using dtrain::test::run_ranks;
using dtrain::test::ThreadComm;

namespace {

std::string fresh_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  const fs::path p =
      fs::temp_directory_path() /
      ("dtrain_ckpt_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  return p.string();
}

template <class C>
void save_run(C& ckpt, std::int64_t step, FakeRun& r) {
  ckpt.save(step, named("model", r.model), named("optimizer", r.opt),
            per_rank("sampler", r.sampler), named("dropout", r.dropout),
            named("schedule", r.sched));
}
template <class C>
std::optional<std::int64_t> restore_run(C& ckpt, FakeRun& r) {
  return ckpt.restore_latest(named("model", r.model), named("optimizer", r.opt),
                             per_rank("sampler", r.sampler), named("dropout", r.dropout),
                             named("schedule", r.sched));
}

void flip_byte(const std::string& path, std::uintmax_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

struct WrongDtype {
  dtrain::Tensor* t;
  template <class V>
  void visit_state(V& v) {
    v.tensor("fc1/weight", t->view(), t->shape());
  }
};
struct MissingScalar {
  std::int64_t x = 0;
  template <class V>
  void visit_state(V& v) {
    v.scalar("not_there", x);
  }
};
struct TwiceVisited {
  std::int64_t x = 0;
  template <class V>
  void visit_state(V& v) {
    v.scalar("x", x);
    v.scalar("x", x);
  }
};

/// Long and odd strings, extreme numbers.
struct OddScalars {
  std::string big = std::string(200000, 'x') + "end";
  std::string empty;
  double inf = HUGE_VAL, tiny = 4.9406564584124654e-324;
  std::int64_t most = INT64_MIN;
  std::uint32_t u = 4000000000u;
  bool flag = true;
  template <class V>
  void visit_state(V& v) {
    v.scalar("big", big);
    v.scalar("empty", empty);
    v.scalar("inf", inf);
    v.scalar("tiny", tiny);
    v.scalar("most", most);
    v.scalar("u", u);
    v.scalar("flag", flag);
  }
};

CheckpointOptions opts(std::int64_t every_steps, int keep_last, std::string config = "") {
  CheckpointOptions o;
  o.every_steps = every_steps;
  o.keep_last = keep_last;
  o.config = std::move(config);
  return o;
}

}  // namespace

TEST_CASE("a fresh run directory restores nothing and leaves objects untouched") {
  const std::string dir = fresh_dir("fresh");
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(comm.rank()), b(comm.rank());
    CHECK_FALSE(restore_run(ckpt, a).has_value());
    CHECK(dtrain::test::first_difference(a, b).empty());
  });
  CHECK(fs::is_directory(dir));
  fs::remove_all(dir);
}

TEST_CASE("save and restore round-trip every dtype, shape and scalar kind exactly") {
  const std::string dir = fresh_dir("roundtrip");
  run_ranks(1, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, opts(0, 2, "lr=0.01\nbatch=32"));
    FakeRun a(0);
    for (int i = 0; i < 3; ++i) a.step(comm);
    a.sched.warmup_fraction = 0.125f;
    save_run(ckpt, 3, a);
    OddScalars odd, odd_back;
    odd.big[7] = 'y';
    odd.empty = "";
    ckpt.save(4, named("odd", odd));
    odd_back.big.clear();
    odd_back.inf = 0;
    odd_back.tiny = 0;
    odd_back.most = 0;
    odd_back.u = 0;
    odd_back.flag = false;
    REQUIRE(ckpt.restore_latest(named("odd", odd_back)) == std::optional<std::int64_t>(4));
    CHECK(odd_back.big == odd.big);
    CHECK(odd_back.empty.empty());
    CHECK(odd_back.inf == HUGE_VAL);
    CHECK(odd_back.tiny == odd.tiny);
    CHECK(odd_back.most == INT64_MIN);
    CHECK(odd_back.u == 4000000000u);
    CHECK(odd_back.flag);
    dtrain::detail::remove_file_quietly(ckpt.path_for(4));
    FakeRun b(0);
    REQUIRE(dtrain::test::first_difference(a, b) != "");
    auto step = restore_run(ckpt, b);
    REQUIRE(step.has_value());
    CHECK(*step == 3);
    CHECK(dtrain::test::first_difference(a, b) == "");
    CHECK(b.opt.name == a.opt.name);
  });
  // An independent look at the file through HDF5's own API: metadata and a tensor's true shape.
  const std::string file = dir + "/ckpt-000000000003.h5";
  REQUIRE(fs::exists(file));
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, "/model/fc1/weight", H5P_DEFAULT);
  REQUIRE(d >= 0);
  hid_t sp = H5Dget_space(d);
  hsize_t dims[2] = {0, 0};
  CHECK(H5Sget_simple_extent_ndims(sp) == 2);
  H5Sget_simple_extent_dims(sp, dims, nullptr);
  CHECK(dims[0] == 6);
  CHECK(dims[1] == 4);
  hid_t ty = H5Dget_type(d);
  CHECK(H5Tequal(ty, H5T_IEEE_F32LE) > 0);
  H5Tclose(ty);
  H5Sclose(sp);
  H5Dclose(d);
  hid_t dc = H5Dopen2(f, "/config", H5P_DEFAULT);
  hid_t ct = H5Dget_type(dc);
  std::string cfg(H5Tget_size(ct), '\0');
  H5Dread(dc, ct, H5S_ALL, H5S_ALL, H5P_DEFAULT, cfg.data());
  CHECK(cfg == "lr=0.01\nbatch=32");
  H5Tclose(ct);
  H5Dclose(dc);
  CHECK(H5Aexists_by_name(f, "/ranks/0/sampler", "cursor", H5P_DEFAULT) > 0);
  CHECK(H5Aexists_by_name(f, "/optimizer", "lr", H5P_DEFAULT) > 0);
  H5Fclose(f);
  fs::remove_all(dir);
}

static void bit_exact_resume(int ranks, dtrain::CheckpointStrategy strategy, bool async) {
  const std::string dir = fresh_dir("resume");
  const int total = 9, stop = 5;
  run_ranks(ranks, [&](ThreadComm& comm) {
    CheckpointOptions o;
    o.every_steps = 5;
    o.keep_last = 2;
    o.async = async;
    o.strategy = strategy;
    // Reference: an uninterrupted run.
    FakeRun ref(comm.rank());
    for (int s = 1; s <= total; ++s) ref.step(comm);
    // Interrupted run: saves at step 5 and dies at step 7 (its later state is lost).
    {
      Checkpointer<ThreadComm> ckpt(comm, dir, o);
      FakeRun run(comm.rank());
      for (std::int64_t s = 1; s <= 7; ++s) {
        run.step(comm);
        ckpt.maybe_save(s, named("model", run.model), named("optimizer", run.opt),
                        per_rank("sampler", run.sampler), named("dropout", run.dropout),
                        named("schedule", run.sched));
      }
      ckpt.wait();
    }
    // Restart: fresh objects, restore, continue to the end.
    Checkpointer<ThreadComm> ckpt(comm, dir, o);
    FakeRun resumed(comm.rank());
    auto step = restore_run(ckpt, resumed);
    REQUIRE(step.has_value());
    CHECK(*step == stop);
    for (int s = stop + 1; s <= total; ++s) resumed.step(comm);
    CHECK(dtrain::test::first_difference(ref, resumed) == "");
  });
  fs::remove_all(dir);
}

TEST_CASE("bit-exact resume over 1, 2, 3 and 4 thread ranks") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    bit_exact_resume(n, dtrain::CheckpointStrategy::rank0, false);
  }
}

TEST_CASE("bit-exact resume with asynchronous saves") {
  for (int n : {1, 2}) {
    CAPTURE(n);
    bit_exact_resume(n, dtrain::CheckpointStrategy::automatic, true);
  }
}

TEST_CASE("asynchronous save writes the state as of the call, not as later modified") {
  const std::string dir = fresh_dir("async_snapshot");
  run_ranks(2, [&](ThreadComm& comm) {
    CheckpointOptions o;
    o.async = true;
    Checkpointer<ThreadComm> ckpt(comm, dir, o);
    FakeRun a(comm.rank());
    a.step(comm);
    FakeRun snapshot(comm.rank());
    snapshot.step(comm);
    save_run(ckpt, 1, a);
    for (int i = 0; i < 3; ++i) a.step(comm);  // training goes on while the file is written
    ckpt.wait();
    FakeRun b(comm.rank());
    CHECK(restore_run(ckpt, b) == std::optional<std::int64_t>(1));
    CHECK(dtrain::test::first_difference(snapshot, b) == "");
  });
  fs::remove_all(dir);
}

TEST_CASE("a failing background write surfaces on every rank at the next call") {
  const std::string dir = fresh_dir("async_error");
  run_ranks(2, [&](ThreadComm& comm) {
    CheckpointOptions o;
    o.async = true;
    Checkpointer<ThreadComm> ckpt(comm, dir, o);
    FakeRun a(comm.rank());
    comm.barrier();
    if (comm.rank() == 0) {  // the run directory disappears under the writer
      fs::remove_all(dir);
      std::ofstream(dir) << "not a directory";
    }
    comm.barrier();
    save_run(ckpt, 1, a);
    if (comm.rank() == 0)
      CHECK_THROWS_AS(ckpt.wait(), dtrain::IoError);
    else
      CHECK_THROWS_AS(ckpt.wait(), dtrain::RemoteError);
    ckpt.wait();  // the error is reported once
  });
  fs::remove(dir);
}

TEST_CASE("a failing synchronous write throws on every rank and leaves no rank waiting") {
  const std::string dir = fresh_dir("sync_error");
  run_ranks(3, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(comm.rank());
    comm.barrier();
    if (comm.rank() == 0) {
      fs::remove_all(dir);
      std::ofstream(dir) << "not a directory";
    }
    comm.barrier();
    if (comm.rank() == 0)
      CHECK_THROWS_WITH_AS(save_run(ckpt, 1, a), doctest::Contains(".ckpt-000000000001.h5.tmp"),
                           dtrain::IoError);
    else
      CHECK_THROWS_WITH_AS(save_run(ckpt, 1, a), doctest::Contains("rank 0 failed"),
                           dtrain::RemoteError);
    // The communicator is still in step: a collective call works afterwards.
    std::vector<std::int64_t> one{1};
    comm.allreduce(dtrain::BufferView(one.data(), 1, dtrain::DType::i64), dtrain::ReduceOp::sum);
    CHECK(one[0] == 3);
  });
  fs::remove(dir);
}

TEST_CASE("keep_last prunes old checkpoints; maybe_save follows the step interval") {
  const std::string dir = fresh_dir("keep");
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, opts(3, 2));
    FakeRun a(comm.rank());
    int saved = 0;
    for (std::int64_t s = 1; s <= 12; ++s) {
      a.step(comm);
      saved += ckpt.maybe_save(s, named("model", a.model), per_rank("sampler", a.sampler));
    }
    CHECK(saved == 4);
    CHECK_FALSE(ckpt.maybe_save(12, named("model", a.model), per_rank("sampler", a.sampler)));
    comm.barrier();
    const auto files = ckpt.files();
    REQUIRE(files.size() == 2);
    CHECK(files[0].step == 12);
    CHECK(files[1].step == 9);
  });
  fs::remove_all(dir);
}

TEST_CASE("due() is maybe_save's decision: a caller prepares its objects, then saves") {
  const std::string dir = fresh_dir("due");
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, opts(3, 2));
    FakeRun a(comm.rank());
    std::vector<std::int64_t> saved;
    for (std::int64_t s = 1; s <= 7; ++s) {
      a.step(comm);
      if (!ckpt.due(s)) continue;
      ckpt.save(s, named("model", a.model));
      saved.push_back(s);
      CHECK_FALSE(ckpt.due(s));  // saved already
    }
    CHECK(saved == std::vector<std::int64_t>{3, 6});
    CHECK(ckpt.last_step() == 6);
  });
  fs::remove_all(dir);
}

TEST_CASE("maybe_save follows the time interval as seen by rank 0") {
  const std::string dir = fresh_dir("seconds");
  run_ranks(2, [&](ThreadComm& comm) {
    CheckpointOptions o;
    o.every_seconds = 0.2;
    Checkpointer<ThreadComm> ckpt(comm, dir, o);
    FakeRun a(comm.rank());
    CHECK_FALSE(ckpt.maybe_save(1, named("model", a.model)));
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    CHECK(ckpt.due(2));
    CHECK(ckpt.maybe_save(2, named("model", a.model)));
    CHECK_FALSE(ckpt.maybe_save(3, named("model", a.model)));
  });
  fs::remove_all(dir);
}

TEST_CASE("damaged newest checkpoints: corrupt byte, truncation, deletion") {
  const std::string dir = fresh_dir("damage");
  auto make_two = [&](ThreadComm& comm, FakeRun& at1) {
    Checkpointer<ThreadComm> ckpt(comm, dir, opts(0, 5));
    FakeRun a(comm.rank());
    a.step(comm);
    save_run(ckpt, 1, a);
    at1.step(comm);
    a.step(comm);
    save_run(ckpt, 2, a);
  };
  const std::string newest = dir + "/ckpt-000000000002.h5";
  // Offset of the model's largest tensor data in the newest file, from HDF5 itself.
  auto data_offset = [&] {
    hid_t f = H5Fopen(newest.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/optimizer/m/0", H5P_DEFAULT);
    const haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    return static_cast<std::uintmax_t>(off);
  };
  for (const std::string damage : {"corrupt", "truncate", "delete"}) {
    CAPTURE(damage);
    fs::remove_all(dir);
    run_ranks(2, [&](ThreadComm& comm) {
      FakeRun expected(comm.rank());
      make_two(comm, expected);
      comm.barrier();
      if (comm.rank() == 0) {
        if (damage == "corrupt") flip_byte(newest, data_offset() + 5);
        if (damage == "truncate") fs::resize_file(newest, fs::file_size(newest) / 2);
        if (damage == "delete") fs::remove(newest);
      }
      comm.barrier();
      Checkpointer<ThreadComm> ckpt(comm, dir, opts(0, 5));
      FakeRun b(comm.rank());
      CHECK(restore_run(ckpt, b) == std::optional<std::int64_t>(1));
      CHECK(dtrain::test::first_difference(expected, b) == "");
    });
    // The damaged file is set aside so that it cannot shadow later checkpoints.
    if (damage != "delete") CHECK(fs::exists(newest + ".damaged"));
    CHECK_FALSE(fs::exists(newest));
  }
  // No valid checkpoint at all: a clear error on every rank.
  fs::remove_all(dir);
  run_ranks(2, [&](ThreadComm& comm) {
    FakeRun unused(comm.rank());
    make_two(comm, unused);
    comm.barrier();
    if (comm.rank() == 0)
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".h5") fs::resize_file(e.path(), 100);
    comm.barrier();
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun b(comm.rank());
    try {
      restore_run(ckpt, b);
      FAIL("restore of damaged files succeeded");
    } catch (const dtrain::Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("no valid checkpoint") != std::string::npos);
      CHECK(msg.find("ckpt-000000000001.h5") != std::string::npos);
    }
  });
  fs::remove_all(dir);
}

TEST_CASE(
    "verified in pieces of a few elements: the same restore, a changed byte in any piece found") {
  // A restore verifies the file piece by piece (16 MiB at most) without keeping it; here pieces
  // of 6 f32 elements, so that each tensor is read as many runs across its rows.
  const std::string dir = fresh_dir("pieces");
  const std::size_t saved_piece = dtrain::detail::ckpt_h5::read_piece_bytes();
  dtrain::detail::ckpt_h5::read_piece_bytes() = 24;
  const std::string newest = dir + "/ckpt-000000000002.h5";
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, opts(0, 5));
    FakeRun a(comm.rank());
    for (std::int64_t s = 1; s <= 2; ++s) {
      a.step(comm);
      save_run(ckpt, s, a);
    }
    Checkpointer<ThreadComm> again(comm, dir, opts(0, 5));
    FakeRun b(comm.rank());
    CHECK(restore_run(again, b) == std::optional<std::int64_t>(2));
    CHECK(dtrain::test::first_difference(a, b) == "");
  });
  // A byte changed anywhere in a tensor's data fails verification, in whichever piece it is.
  const auto m = dtrain::Hdf5Format::read(newest);
  const dtrain::detail::CkptEntry* victim = nullptr;
  for (const auto& e : m.entries)
    if (e.path == "/optimizer/m/0") victim = &e;
  REQUIRE(victim != nullptr);
  REQUIRE(victim->bytes() > 3 * 24);
  haddr_t off = HADDR_UNDEF;
  {
    dtrain::detail::H5Session session;
    hid_t f = H5Fopen(newest.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, victim->path.c_str(), H5P_DEFAULT);
    off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  REQUIRE(off != HADDR_UNDEF);
  for (std::size_t at : {std::size_t{0}, std::size_t{23}, std::size_t{24}, victim->bytes() / 2,
                         victim->bytes() - 1}) {
    CAPTURE(at);
    flip_byte(newest, static_cast<std::uintmax_t>(off) + at);
    CHECK_THROWS_WITH_AS(dtrain::Hdf5Format::verify(newest), doctest::Contains("checksum mismatch"),
                         dtrain::IoError);
    flip_byte(newest, static_cast<std::uintmax_t>(off) + at);  // back as it was
    CHECK_NOTHROW(dtrain::Hdf5Format::verify(newest));
  }
  dtrain::detail::ckpt_h5::read_piece_bytes() = saved_piece;
  fs::remove_all(dir);
}

TEST_CASE("any single damaged byte is detected or harmless, never silently loaded") {
  const std::string dir = fresh_dir("flip");
  const std::string newest = dir + "/ckpt-000000000002.h5";
  std::string pristine;
  run_ranks(1, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, opts(0, 5));
    FakeRun a(0);
    a.step(comm);
    save_run(ckpt, 1, a);
    a.step(comm);
    save_run(ckpt, 2, a);
  });
  {
    std::ifstream in(newest, std::ios::binary);
    pristine.assign(std::istreambuf_iterator<char>(in), {});
  }
  FakeRun at1(0), at2(0);
  run_ranks(1, [&](ThreadComm& comm) {
    at1.step(comm);
    at2.step(comm);
    at2.step(comm);
  });
  dtrain::RngStream pick(77, 0);
  int detected = 0, harmless = 0;
  dtrain::set_log_level(dtrain::LogLevel::error);
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t off = static_cast<std::size_t>(pick.below(pristine.size()));
    std::string bad = pristine;
    bad[off] = static_cast<char>(bad[off] ^ (1 << (trial % 8)));
    {
      std::ofstream out(newest, std::ios::binary | std::ios::trunc);
      out.write(bad.data(), static_cast<std::streamsize>(bad.size()));
    }
    run_ranks(1, [&](ThreadComm& comm) {
      Checkpointer<ThreadComm> ckpt(comm, dir, opts(0, 5));
      FakeRun b(0);
      std::optional<std::int64_t> step;
      try {
        step = restore_run(ckpt, b);
      } catch (const dtrain::InvalidArgument&) {
        // A flipped shape or name reads as a different model: refused loudly, also fine.
        ++detected;
        return;
      }
      REQUIRE(step.has_value());
      if (*step == 1) {
        ++detected;
        CHECK(dtrain::test::first_difference(at1, b) == "");
      } else {
        ++harmless;
        CAPTURE(off);
        CHECK(dtrain::test::first_difference(at2, b) == "");
      }
    });
    if (fs::exists(newest + ".damaged")) fs::rename(newest + ".damaged", newest);
    CAPTURE(off);
    CHECK(H5Fget_obj_count(static_cast<hid_t>(H5F_OBJ_ALL), H5F_OBJ_ALL) == 0);  // nothing leaked
  }
  dtrain::set_log_level(dtrain::LogLevel::info);
  MESSAGE("damaged bytes detected: " << detected << ", in unused space: " << harmless);
  CHECK(detected > 0);
  fs::remove_all(dir);
}

TEST_CASE("loading into different shapes names the first mismatching tensor and both shapes") {
  const std::string dir = fresh_dir("mismatch");
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(comm.rank(), 6);
    save_run(ckpt, 4, a);
    FakeRun wider(comm.rank(), 8);
    try {
      restore_run(ckpt, wider);
      FAIL("restore into a different model succeeded");
    } catch (const dtrain::InvalidArgument& e) {
      const std::string msg = e.what();
      CAPTURE(msg);
      CHECK(msg.find("/model/fc1/weight") != std::string::npos);
      CHECK(msg.find("[6, 4]") != std::string::npos);
      CHECK(msg.find("[8, 4]") != std::string::npos);
    }
    // Nothing was modified by the refused restore.
    FakeRun fresh(comm.rank(), 8);
    CHECK(dtrain::test::first_difference(fresh, wider) == "");
    // A missing object member and a dtype change are refused too.
    dtrain::Tensor other({6, 4}, dtrain::DType::f64);
    WrongDtype wrong{&other};
    CHECK_THROWS_WITH_AS(ckpt.restore_latest(named("model", wrong)),
                         doctest::Contains("dtype differs: checkpoint f32, object f64"),
                         dtrain::InvalidArgument);
    MissingScalar missing;
    CHECK_THROWS_WITH_AS(ckpt.restore_latest(named("model", missing)),
                         doctest::Contains("/model/not_there: integer scalar not found"),
                         dtrain::InvalidArgument);
  });
  fs::remove_all(dir);
}

TEST_CASE("a file of an unknown format version is refused with a clear error") {
  const std::string dir = fresh_dir("version");
  run_ranks(1, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(0);
    save_run(ckpt, 1, a);
  });
  {
    const std::string file = dir + "/ckpt-000000000001.h5";
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t at = H5Aopen(f, "format_version", H5P_DEFAULT);
    const std::int64_t v = 99;
    H5Awrite(at, H5T_NATIVE_INT64, &v);
    H5Aclose(at);
    H5Fclose(f);
  }
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun b(comm.rank());
    CHECK_THROWS_WITH_AS(restore_run(ckpt, b),
                         doctest::Contains("unknown checkpoint format version 99"),
                         dtrain::InvalidArgument);
  });
  fs::remove_all(dir);
}

TEST_CASE("restoring on a different number of ranks: replicated state yes, per-rank on request") {
  const std::string dir = fresh_dir("resize");
  FakeRun saved(0);
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(comm.rank());
    for (int i = 0; i < 2; ++i) a.step(comm);
    save_run(ckpt, 2, a);
    if (comm.rank() == 0) {
      comm.barrier();
    } else {
      comm.barrier();
    }
  });
  run_ranks(3, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> strict(comm, dir, CheckpointOptions{});
    FakeRun b(comm.rank());
    CHECK_THROWS_WITH_AS(restore_run(strict, b), doctest::Contains("written by 2 ranks"),
                         dtrain::InvalidArgument);
    CheckpointOptions o;
    o.reset_per_rank_on_resize = true;
    Checkpointer<ThreadComm> lenient(comm, dir, o);
    FakeRun c(comm.rank());
    const dtrain::test::FakeSampler fresh_sampler(comm.rank());
    CHECK(restore_run(lenient, c) == std::optional<std::int64_t>(2));
    CHECK(c.opt.steps == 2);
    CHECK(c.sampler.cursor == fresh_sampler.cursor);
    // Replicated state is the same on every rank after the restore.
    std::vector<double> w(c.model.fc1.weight.size());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = c.model.fc1.weight.as<float>()[i];
    std::vector<double> lo = w, hi = w;
    comm.allreduce(dtrain::BufferView(lo.data(), lo.size(), dtrain::DType::f64),
                   dtrain::ReduceOp::min);
    comm.allreduce(dtrain::BufferView(hi.data(), hi.size(), dtrain::DType::f64),
                   dtrain::ReduceOp::max);
    CHECK(lo == hi);
  });
  fs::remove_all(dir);
}

TEST_CASE("bad names, duplicates and ranks that disagree are refused") {
  const std::string dir = fresh_dir("names");
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(comm.rank());
    CHECK_THROWS_AS(ckpt.save(1, named("ranks", a.model)), dtrain::InvalidArgument);
    CHECK_THROWS_AS(ckpt.save(1, named("a/b", a.model)), dtrain::InvalidArgument);
    CHECK_THROWS_AS(ckpt.save(1, named("m", a.model), named("m", a.opt)), dtrain::InvalidArgument);
    TwiceVisited twice;
    CHECK_THROWS_WITH_AS(ckpt.save(1, named("t", twice)), doctest::Contains("visited twice"),
                         dtrain::InvalidArgument);
    // A replicated object whose shape depends on the rank is caught before anything is written.
    dtrain::test::FakeModel skewed(comm.rank() == 0 ? 6 : 7);
    CHECK_THROWS_WITH_AS(ckpt.save(1, named("model", skewed)),
                         doctest::Contains("differ in structure between ranks"),
                         dtrain::InvalidArgument);
    CHECK(ckpt.files().empty());
  });
  CHECK_THROWS_AS(
      run_ranks(1, [&](ThreadComm& comm) { Checkpointer<ThreadComm> c(comm, dir, opts(0, 0)); }),
      dtrain::InvalidArgument);
  fs::remove_all(dir);
}

TEST_CASE("temporaries left by an interrupted save are removed at start") {
  const std::string dir = fresh_dir("stale");
  fs::create_directories(dir);
  std::ofstream(dir + "/.ckpt-000000000007.h5.tmp") << "half a file";
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, CheckpointOptions{});
    FakeRun a(comm.rank());
    CHECK_FALSE(restore_run(ckpt, a).has_value());
  });
  CHECK_FALSE(fs::exists(dir + "/.ckpt-000000000007.h5.tmp"));
  fs::remove_all(dir);
}

TEST_CASE("the deadline of a parallel write: silent when the write ends in time, names it after") {
  std::mutex m;
  std::vector<std::string> fired;
  dtrain::detail::io_watchdog_expiry_hook() = [&](const std::string& msg) {
    std::lock_guard<std::mutex> lock(m);
    fired.push_back(msg);
  };
  {  // Finished well before its deadline: the watchdog never fires, and stops at once.
    const auto t0 = std::chrono::steady_clock::now();
    { dtrain::detail::IoWatchdog w(30, "never"); }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
  { dtrain::detail::IoWatchdog w(0, "disabled"); }  // <= 0: no deadline, no thread
  {  // Still inside the write at the deadline: fires once with its message.
    dtrain::detail::IoWatchdog w(0.05, "dtrain: rank 1: checkpoint save: 'x.tmp': late");
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  dtrain::detail::io_watchdog_expiry_hook() = nullptr;
  REQUIRE(fired.size() == 1);
  CHECK(fired[0] == "dtrain: rank 1: checkpoint save: 'x.tmp': late");
}
