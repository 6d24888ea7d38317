// The failure policy (<dtrain/core/failure.hpp>): UnwindGuard sees stack unwinding, job_failed
// reports once, and under abort_job an exception escaping run_main ends the process through the
// abort hook with the error as its first line and without running any destructor. The cases that
// end a process run in a forked child whose stderr and exit status the parent inspects.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>

namespace {

struct Probe {
  dtrain::UnwindGuard guard;
  bool* saw_failing;
  explicit Probe(bool* out) : saw_failing(out) {}
  ~Probe() { *saw_failing = guard.failing(); }
};

struct Child {
  int status = -1;
  std::string err;
};

/// Runs `body` in a child process with stderr captured, on a thread of its own: doctest's
/// handler around the test case is not on that thread's stack, so an exception escaping `body`
/// finds no handler, as in a main() without try. The child ends with _exit(0) if `body` returns.
template <class F>
Child run_child(F&& body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    std::thread t(body);
    t.join();
    _exit(0);
  }
  close(fds[1]);
  Child c;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) c.err.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  waitpid(pid, &c.status, 0);
  return c;
}

void exit_42(int) noexcept { std::_Exit(42); }

}  // namespace

TEST_CASE("UnwindGuard: false on a normal exit, true while an exception unwinds the owner") {
  bool failing = true;
  { Probe p(&failing); }
  CHECK_FALSE(failing);
  try {
    Probe p(&failing);
    throw std::runtime_error("x");
  } catch (const std::exception&) {
  }
  CHECK(failing);
  // An object made inside a catch block (one exception alive but not unwinding) is not failing.
  try {
    throw std::runtime_error("y");
  } catch (const std::exception&) {
    failing = true;
    { Probe p(&failing); }
    CHECK_FALSE(failing);
  }
}

TEST_CASE("propagate: job_failed prints the first error once, returns 1 and marks the job") {
  const Child c = run_child([] {
    dtrain::set_failure_policy(dtrain::FailurePolicy::propagate);
    const int a = dtrain::job_failed(
        std::make_exception_ptr(dtrain::make_error<dtrain::IoError>(3, "read", "first")));
    const int b = dtrain::job_failed(std::make_exception_ptr(std::runtime_error("second")));
    bool failing = false;
    { Probe p(&failing); }
    std::_Exit(a == 1 && b == 1 && failing && dtrain::job_failing() ? 7 : 1);
  });
  REQUIRE(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 7);
  CHECK(c.err == "dtrain: rank 3: read: first\n");
}

TEST_CASE("propagate: run_main unwinds, then reports and returns 1") {
  const Child c = run_child([] {
    dtrain::set_failure_policy(dtrain::FailurePolicy::propagate);
    bool failing = false;
    const int code = dtrain::run_main([&]() -> int {
      Probe p(&failing);
      dtrain::raise<dtrain::InvalidArgument>("step 5", "bad label");
    });
    std::_Exit(code == 1 && failing ? 7 : 1);
  });
  REQUIRE(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 7);
  CHECK(c.err.find("step 5: bad label") != std::string::npos);
}

TEST_CASE("abort_job: run_main ends the job through the hook without unwinding") {
  const Child c = run_child([] {
    dtrain::detail::RankScope rank(2);
    dtrain::set_failure_policy(dtrain::FailurePolicy::abort_job);
    dtrain::set_abort_hook(&exit_42);
    dtrain::install_terminate_handler();
    struct Loud {
      ~Loud() { std::fputs("destructor ran\n", stderr); }
    };
    dtrain::run_main([]() -> int {
      Loud l;
      dtrain::raise<dtrain::IoError>("Hdf5Dataset::read", "label 10 of row 6");
    });
  });
  REQUIRE(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 42);
  CHECK(c.err == "dtrain: rank 2: Hdf5Dataset::read: label 10 of row 6\n");
}

TEST_CASE("abort_job: an uncaught exception on another thread aborts with its message") {
  const Child c = run_child([] {
    dtrain::set_abort_hook(&exit_42);
    dtrain::install_terminate_handler();
    std::thread t([] { throw std::logic_error("worker broke"); });
    t.join();
  });
  REQUIRE(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 42);
  CHECK(c.err.find("fatal: worker broke") != std::string::npos);
}
