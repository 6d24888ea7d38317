// Strict environment parsing (<dtrain/core/env.hpp>) and its readers: every malformed value is an
// InvalidArgument naming the variable and what is accepted; nothing is read where a
// configuration is passed explicitly.
#include <doctest/doctest.h>

#include "support/messages.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/env.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/transports/loopback.hpp>
#include <dtrain/transports/one_sided/ibverbs_config.hpp>

using namespace dtrain;

namespace {
// Sets a variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

using test::contains;
using test::invalid_argument_text;
}  // namespace

TEST_CASE("booleans: exactly 0 1 true false on off yes no") {
  for (const char* t : {"1", "true", "on", "yes"}) CHECK(env::parse_bool("V", t));
  for (const char* f : {"0", "false", "off", "no"}) CHECK(!env::parse_bool("V", f));
  for (const char* bad : {"2", "True", "enable", " 1", "1 ", "y", "-1"}) {
    CAPTURE(bad);
    const std::string m = invalid_argument_text([&] { env::parse_bool("DTRAIN_X", bad); });
    CHECK(contains(m, "DTRAIN_X"));
    CHECK(contains(m, "0 1 true false on off yes no"));
  }
}

TEST_CASE("numbers must be whole, plain, finite and in range") {
  CHECK(env::parse_int("V", "64", 1, 100) == 64);
  CHECK(env::parse_int("V", "-3", -5, 5) == -3);
  CHECK(env::parse_double("V", "2.5e-3", 0, 1) == 2.5e-3);
  for (const char* bad : {"64abc", "1e3", " 64", "0x40", "", "+", "101", "99999999999999999999"})
    CHECK(contains(invalid_argument_text([&] { env::parse_int("DTRAIN_N", bad, 1, 100); }),
                   "DTRAIN_N"));
  for (const char* bad : {"abc", "1.5x", "inf", "nan", "0x1p3", "2", "-0.5"})
    CHECK(contains(invalid_argument_text([&] { env::parse_double("DTRAIN_D", bad, 0, 1); }),
                   "[0, 1]"));
  CHECK(env::parse_choice("V", "b", {"a", "b"}) == 1);
  CHECK(contains(invalid_argument_text([&] {
                   env::parse_choice("DTRAIN_C", "B", {"a", "b"});
                 }),
                 "one of: a b"));
}

TEST_CASE("unset or empty keeps the default") {
  ::unsetenv("DTRAIN_TEST_UNSET");
  CHECK(env::get_bool("DTRAIN_TEST_UNSET", true));
  CHECK(env::get_int("DTRAIN_TEST_UNSET", 7, 0, 10) == 7);
  ScopedEnv e("DTRAIN_TEST_EMPTY", "");
  CHECK(!env::get_bool("DTRAIN_TEST_EMPTY", false));
  CHECK(env::get_double("DTRAIN_TEST_EMPTY", 0.5, 0, 1) == 0.5);
}

TEST_CASE("CommConfig::from_env is strict and names the variable") {
  {
    ScopedEnv e("DTRAIN_COMM_CHECK", "off");
    CHECK(!CommConfig::from_env().check_fingerprints);
  }
  {
    ScopedEnv e("DTRAIN_COMM_PERSISTENT", "no");
    CHECK(!CommConfig::from_env().persistent_channels);
  }
  {
    ::unsetenv("DTRAIN_ALLREDUCE_ADAPT");
    CHECK(!CommConfig::from_env().adaptive);
    ScopedEnv e("DTRAIN_ALLREDUCE_ADAPT", "1");
    CHECK(CommConfig::from_env().adaptive);
  }
  {
    ScopedEnv e("DTRAIN_COMM_TIMEOUT_S", "12.5");
    CHECK(CommConfig::from_env().timeout_s == 12.5);
  }
  {
    ::unsetenv("DTRAIN_COMM_PROGRESS");
    CHECK(CommConfig::from_env().progress == CommProgress::automatic);
    const std::pair<const char*, CommProgress> modes[] = {{"auto", CommProgress::automatic},
                                                          {"thread", CommProgress::thread},
                                                          {"caller", CommProgress::caller}};
    for (const auto& m : modes) {
      ScopedEnv e("DTRAIN_COMM_PROGRESS", m.first);
      CHECK(CommConfig::from_env().progress == m.second);
    }
  }
  const struct {
    const char* name;
    const char* value;
  } bad[] = {{"DTRAIN_COMM_CHECK", "maybe"},         {"DTRAIN_COMM_PERSISTENT", "2"},
             {"DTRAIN_COMM_TIMEOUT_S", "abc"},       {"DTRAIN_COMM_TIMEOUT_S", "0"},
             {"DTRAIN_COMM_SEGMENT_BYTES", "64abc"}, {"DTRAIN_COMM_PROGRESS", "threads"},
             {"DTRAIN_ALLREDUCE_ALGO", "Ring"},      {"DTRAIN_COMM_ALPHA", "-1"},
             {"DTRAIN_ALLREDUCE_ADAPT", "sometimes"}};
  for (const auto& b : bad) {
    CAPTURE(b.name);
    CAPTURE(b.value);
    ScopedEnv e(b.name, b.value);
    CHECK(contains(invalid_argument_text([] { CommConfig::from_env(); }), b.name));
  }
}

TEST_CASE("shared-segment sizing and the log level are strict too") {
  {
    ScopedEnv e("DTRAIN_SHM", "off");
    CHECK(!SharedSegmentConfig::from_env().enabled);
  }
  {
    ScopedEnv e("DTRAIN_SHM_SLOT_BYTES", "1000");
    CHECK(SharedSegmentConfig::from_env().slot_bytes == 960);  // rounded down to 64 B
  }
  {
    CHECK(SharedSegmentConfig::from_env().heap_bytes == 0);  // no heap unless asked for
    ScopedEnv e("DTRAIN_SHM_HEAP_MIB", "48");
    CHECK(SharedSegmentConfig::from_env().heap_bytes == (std::size_t{48} << 20));
  }
  {
    ::unsetenv("DTRAIN_COMM_TIMEOUT_S");
    CHECK(SharedSegmentConfig::from_env().setup_timeout_s == SharedSegmentConfig{}.setup_timeout_s);
    ScopedEnv e("DTRAIN_COMM_TIMEOUT_S", "12.5");  // the transport's setup has the same deadline
    CHECK(SharedSegmentConfig::from_env().setup_timeout_s == 12.5);
  }
  for (auto [name, value] : {std::pair<const char*, const char*>{"DTRAIN_SHM", "2"},
                             {"DTRAIN_COMM_TIMEOUT_S", "0"},
                             {"DTRAIN_SHM_SLOTS", "100"},
                             {"DTRAIN_SHM_HEAP_MIB", "-1"},
                             {"DTRAIN_SHM_HEAP_MIB", "64k"},
                             {"DTRAIN_SHM_SLOT_BYTES", "16"}}) {
    ScopedEnv e(name, value);
    CHECK(contains(invalid_argument_text([] { SharedSegmentConfig::from_env(); }), name));
    CHECK(contains(invalid_argument_text([] { LoopbackWorld w(2); }), name));
  }
  {
    ScopedEnv e("DTRAIN_LOG_LEVEL", "loud");
    CHECK(
        contains(invalid_argument_text([] { detail::log_level_from_env(); }), "DTRAIN_LOG_LEVEL"));
  }
  ScopedEnv e("DTRAIN_LOG_LEVEL", "warning");
  CHECK(detail::log_level_from_env() == static_cast<int>(LogLevel::warn));
}

TEST_CASE("an explicit configuration reads no environment; the one-argument forms read it once") {
  ScopedEnv e("DTRAIN_COMM_CHECK", "bogus");
  ScopedEnv s("DTRAIN_SHM", "bogus");
  SharedSegmentConfig seg;
  seg.enabled = false;
  LoopbackWorld world(1, seg);  // no DTRAIN_SHM read
  LoopbackTransport t(world, 0);
  CommConfig c;
  Communicator<LoopbackTransport> explicit_config(t, c);
  CHECK(explicit_config.config().check_fingerprints);
  CHECK(contains(invalid_argument_text([&] { Communicator<LoopbackTransport> from_env(t); }),
                 "DTRAIN_COMM_CHECK"));
}

TEST_CASE("DTRAIN_EXEC_TIMEOUT_S: read strictly, once per process") {
  // Each case runs in a child process: the value is kept for the rest of a process once read.
  auto in_child = [](const char* value, int (*check)()) {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (value)
        ::setenv("DTRAIN_EXEC_TIMEOUT_S", value, 1);
      else
        ::unsetenv("DTRAIN_EXEC_TIMEOUT_S");
      _exit(check());
    }
    int st = 0;
    REQUIRE(waitpid(child, &st, 0) == child);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
  };
  CHECK(in_child(nullptr, [] { return exec_timeout_s() == 300.0 ? 0 : 1; }) == 0);
  CHECK(in_child("12.5", [] { return exec_timeout_s() == 12.5 ? 0 : 1; }) == 0);
  CHECK(in_child("", [] { return exec_timeout_s() == 300.0 ? 0 : 1; }) == 0);  // empty: unset
  for (const char* bad : {"abc", "10s", "0", "-5", "nan"}) {
    CAPTURE(std::string(bad));
    CHECK(in_child(bad, [] {
            const std::string m = invalid_argument_text([] { exec_timeout_s(); });
            return contains(m, "DTRAIN_EXEC_TIMEOUT_S") ? 0 : 1;
          }) == 0);
  }
}

TEST_CASE("the verbs device choice: read strictly from DTRAIN_IB_*, in one place") {
  {
    const IbverbsDeviceConfig d = IbverbsDeviceConfig::from_env();
    CHECK(d.device.empty());
    CHECK(d.port == 0);
    CHECK(d.gid_index == -1);
  }
  {
    ScopedEnv dev("DTRAIN_IB_DEVICE", "mlx5_1"), port("DTRAIN_IB_PORT", "2"),
        gid("DTRAIN_IB_GID_INDEX", "3");
    const IbverbsDeviceConfig d = IbverbsDeviceConfig::from_env();
    CHECK(d.device == "mlx5_1");
    CHECK(d.port == 2);
    CHECK(d.gid_index == 3);
  }
  for (const char* bad : {"0", "256", "1x", "one", "-1"}) {
    CAPTURE(std::string(bad));
    ScopedEnv port("DTRAIN_IB_PORT", bad);
    CHECK(
        contains(invalid_argument_text([] { IbverbsDeviceConfig::from_env(); }), "DTRAIN_IB_PORT"));
  }
  for (const char* bad : {"-1", "65536", "3.5"}) {
    CAPTURE(std::string(bad));
    ScopedEnv gid("DTRAIN_IB_GID_INDEX", bad);
    CHECK(contains(invalid_argument_text([] { IbverbsDeviceConfig::from_env(); }),
                   "DTRAIN_IB_GID_INDEX"));
  }
}
