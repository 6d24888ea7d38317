// The deadlines of collective file calls (core/io_watchdog.hpp), with the expiry hook in place of
// ending the job.
#include <doctest/doctest.h>

#include <dtrain/core/io_watchdog.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace std::chrono_literals;

namespace {

struct Recorder {
  std::mutex m;
  std::vector<std::string> fired;
  Recorder() {
    detail::io_watchdog_expiry_hook() = [this](const std::string& msg) {
      std::lock_guard<std::mutex> lock(m);
      fired.push_back(msg);
    };
  }
  ~Recorder() { detail::io_watchdog_expiry_hook() = nullptr; }
  std::vector<std::string> seen() {
    std::lock_guard<std::mutex> lock(m);
    return fired;
  }
};

}  // namespace

TEST_CASE("IoWatchdog fires after its deadline, not when destroyed before it") {
  Recorder rec;
  { detail::IoWatchdog w(0.5, "early"); }
  {
    detail::IoWatchdog w(0.05, "late");
    std::this_thread::sleep_for(300ms);
  }
  { detail::IoWatchdog w(0, "disabled"); }
  CHECK(rec.seen() == std::vector<std::string>{"late"});
}

TEST_CASE("IoWatchdogThread: once per overrun section, never for a section on time") {
  Recorder rec;
  detail::IoWatchdogThread w(0.1);
  for (int i = 0; i < 20; ++i) {  // sections on time
    w.arm("on time " + std::to_string(i));
    w.disarm();
  }
  w.arm("overrun 1");
  std::this_thread::sleep_for(400ms);  // four deadlines long: still one message
  w.disarm();
  CHECK(rec.seen() == std::vector<std::string>{"overrun 1"});
  w.arm("on time again");
  w.disarm();
  std::this_thread::sleep_for(250ms);
  w.arm("overrun 2");  // re-armed after a firing: fires again
  std::this_thread::sleep_for(300ms);
  w.disarm();
  CHECK(rec.seen() == std::vector<std::string>{"overrun 1", "overrun 2"});
}

TEST_CASE("IoWatchdogThread without a deadline starts no thread and never fires") {
  Recorder rec;
  {
    detail::IoWatchdogThread w(0);
    w.arm("never");
    std::this_thread::sleep_for(50ms);
  }
  detail::IoWatchdogThread armed_at_exit(0.05);
  armed_at_exit.arm("left armed");  // the destructor stops the thread without waiting for it
  CHECK(rec.seen().empty());
}
