#include <doctest/doctest.h>

#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>

#include <string>
#include <thread>

using namespace dtrain;

TEST_CASE("errors carry the rank of the raising thread and the operation") {
  std::string seen[2];
  std::thread a([&] {
    detail::RankScope s(0);
    try {
      raise<TimeoutError>("allreduce #812 (ring, 4194304 B)",
                          "wait for rank 1 timed out after 300 s");
    } catch (const TimeoutError& e) {
      seen[0] = e.what();
    }
  });
  std::thread b([&] {
    detail::RankScope s(5);
    try {
      DTRAIN_REQUIRE(1 + 1 == 3, "broadcast", "root " << 9 << " out of range for 4 ranks");
    } catch (const InvalidArgument& e) {
      seen[1] = e.what();
    }
  });
  a.join();
  b.join();
  CHECK(seen[0] ==
        "dtrain: rank 0: allreduce #812 (ring, 4194304 B): wait for rank 1 timed out after 300 s");
  CHECK(seen[1] == "dtrain: rank 5: broadcast: root 9 out of range for 4 ranks");
  CHECK(detail::thread_rank() == -1);
  // Every specific error is a dtrain::Error.
  CHECK_THROWS_AS(raise<RemoteError>("x", "y"), Error);
  CHECK_THROWS_AS(raise<DeviceError>("x", "y"), Error);
  CHECK_THROWS_AS(raise<IoError>("x", "y"), Error);
  CHECK_THROWS_AS(raise<TransportError>("x", "y"), Error);
}

TEST_CASE("log levels filter messages") {
  const LogLevel saved = log_level();
  set_log_level(LogLevel::warn);
  CHECK(log_enabled(LogLevel::error));
  CHECK(log_enabled(LogLevel::warn));
  CHECK_FALSE(log_enabled(LogLevel::info));
  int evaluated = 0;
  DTRAIN_LOG(debug, "never built " << ++evaluated);
  CHECK(evaluated == 0);
  set_log_level(saved);
  CHECK(detail::parse_log_level("debug", LogLevel::info) == LogLevel::debug);
  CHECK(detail::parse_log_level("bogus", LogLevel::info) == LogLevel::info);
}

TEST_CASE("timer and deadline are monotonic") {
  Timer t;
  Deadline d(0.02);
  CHECK_FALSE(d.expired());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(d.expired());
  CHECK(t.seconds() >= 0.025);
  CHECK_FALSE(Deadline(-1).expired());
}
